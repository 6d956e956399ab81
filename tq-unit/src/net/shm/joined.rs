//! Columns joined from cells of several segments without copying them.
//!
//! A dense column a same-host get returns is one buffer, but its rows lie in the segments of
//! several units (rows alternate between units) or of several puts. Instead of copying each row
//! into a fresh buffer, the client reserves one range of addresses and maps each row's pages
//! of its segment at the row's place in it (`MAP_FIXED` over the reservation): the column is
//! contiguous, read-only and made of the units' own pages. That needs rows of whole pages at
//! page offsets ([`super::layout`] places them so) and costs one mapping per run of rows that
//! lie back to back in one segment, so rows shorter than [`MIN_RUN_BYTES`] on average are
//! copied instead: mappings are a per-process resource (`vm.max_map_count`, 65530 by default).
//! When any mapping fails (that limit, say) the caller copies as before.
//!
//! The pieces are mapped private and writable (copy-on-write): reading them reads the units'
//! pages, and a write copies the page it touches into this process alone, never into the
//! segment (sealed against writes; the kernel allows private mappings of it). So the column is
//! the reader's own like any freshly assembled one, and is registered as claimable with the
//! read-buffer pool ([`BufferPool::register_unclaimed`]): a reader that hands it to torch, whose tensors are always
//! writable, need not copy it first.

use super::segment::{page_size_is_expected, Segment, PAGE};
use bytes::Bytes;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use tq_core::buffer::BufferPool;

/// Runs of rows (back to back in one segment) shorter than this on average are not worth a
/// mapping each: the column is copied.
pub const MIN_RUN_BYTES: usize = 64 << 10;

/// A range of this process's address space made of copy-on-write pieces of segments.
struct Joined {
    addr: *mut libc::c_void,
    len: usize,
}

// Read through `as_ref`; written only by whoever claimed it (`BufferPool::claim_filled`), which
// then holds the only reference, and writes land in private copies of the pages.
unsafe impl Send for Joined {}
unsafe impl Sync for Joined {}

impl AsRef<[u8]> for Joined {
    fn as_ref(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
}

impl Drop for Joined {
    fn drop(&mut self) {
        BufferPool::global().forget_unclaimed(self.addr as *const u8);
        super::unmap::unmap_later(self.addr, self.len);
    }
}

/// A run of rows: `len` bytes at `offset` of `segment`.
struct Run {
    segment: Arc<Segment>,
    offset: u64,
    len: u64,
}

/// Whether a cell at `offset` of `len` bytes could take part in a join: a non-empty run of
/// whole pages at a page offset of its segment.
pub(crate) fn joinable(offset: u64, len: u64) -> bool {
    len > 0 && offset.is_multiple_of(PAGE) && len.is_multiple_of(PAGE)
}

/// `rows` back to back as one `Bytes`, made of the rows' own pages, or `None` when they
/// cannot be joined that way (a row not in a segment, not of whole pages at a page offset,
/// rows too short, or the kernel refusing a mapping); the caller then copies.
///
/// It gives up as soon as the runs seen can no longer average [`MIN_RUN_BYTES`] (rows that
/// alternate between two units' segments, say: after a few dozen rows, not after all of them),
/// and looks a row up in the process's segment registry only when it is not in the segment of
/// the run before it.
pub fn join<'a, I>(rows: I) -> Option<Bytes>
where
    I: IntoIterator<Item = &'a Bytes>,
    I::IntoIter: Clone,
{
    let rows = rows.into_iter();
    let total: usize = rows.clone().map(Bytes::len).sum();
    // The most runs `total` bytes can be cut into with each at least MIN_RUN_BYTES on average.
    let max_runs = total / MIN_RUN_BYTES;
    if max_runs == 0 || !page_size_is_expected() {
        return None;
    }
    let mut runs: Vec<Run> = Vec::new();
    for row in rows {
        let in_last = runs
            .last()
            .and_then(|run| Some((run.segment.clone(), run.segment.offset_of(row)?)));
        let (segment, offset) = match in_last {
            Some(found) => found,
            None => Segment::containing(row)?,
        };
        let len = row.len() as u64;
        if !joinable(offset, len) {
            return None;
        }
        match runs.last_mut() {
            Some(run) if Arc::ptr_eq(&run.segment, &segment) && run.offset + run.len == offset => {
                run.len += len;
            }
            _ => {
                runs.push(Run {
                    segment,
                    offset,
                    len,
                });
                if runs.len() > max_runs {
                    return None;
                }
            }
        }
    }
    map_runs(&runs, total)
}

fn map_runs(runs: &[Run], total: usize) -> Option<Bytes> {
    // Reserve the whole range first so the pieces land next to each other; the reservation is
    // replaced piece by piece.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        tracing::debug!(bytes = total, error = %std::io::Error::last_os_error(), "cannot reserve a joined column; copying");
        return None;
    }
    // Owns the range from here: dropping it unmaps whatever was mapped.
    let joined = Joined { addr, len: total };
    let mut at = 0usize;
    for run in runs {
        let target = unsafe { (addr as *mut u8).add(at) } as *mut libc::c_void;
        let mapped = unsafe {
            libc::mmap(
                target,
                run.len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                // Copy-on-write; no swap reserved for pages that are never written.
                libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_NORESERVE,
                run.segment.fd().as_raw_fd(),
                run.offset as libc::off_t,
            )
        };
        if mapped != target {
            tracing::debug!(runs = runs.len(), error = %std::io::Error::last_os_error(), "cannot map a joined column; copying");
            return None;
        }
        at += run.len as usize;
    }
    populate(addr, total);
    BufferPool::global().register_unclaimed(addr as *const u8, total);
    Some(Bytes::from_owner(joined))
}

/// Maps the pages now, in one call, rather than a fault per page on first touch (best effort).
fn populate(addr: *mut libc::c_void, len: usize) {
    const MADV_POPULATE_READ: libc::c_int = 22;
    unsafe { libc::madvise(addr, len, MADV_POPULATE_READ) };
}

#[cfg(test)]
mod tests {
    use super::super::segment::layout;
    use super::*;

    fn rows_of(segment: &Arc<Segment>, offsets: &[u64], len: u64) -> Vec<Bytes> {
        offsets
            .iter()
            .map(|&o| segment.slice(o, len).unwrap())
            .collect()
    }

    #[test]
    fn rows_of_two_segments_interleaved_join_into_one_view_of_their_pages() {
        let row = MIN_RUN_BYTES;
        let a: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; row]).collect();
        let b: Vec<Vec<u8>> = (10..13u8).map(|i| vec![i; row]).collect();
        let (offsets, len) = layout([row; 3]);
        let pa: Vec<&[u8]> = a.iter().map(|p| &p[..]).collect();
        let pb: Vec<&[u8]> = b.iter().map(|p| &p[..]).collect();
        let sa = Segment::write(&pa, &offsets, len).unwrap();
        let sb = Segment::write(&pb, &offsets, len).unwrap();
        let (ra, rb) = (
            rows_of(&sa, &offsets, row as u64),
            rows_of(&sb, &offsets, row as u64),
        );
        // Rows alternate between the segments, as they do between two units.
        let rows: Vec<Bytes> = (0..3)
            .flat_map(|i| [ra[i].clone(), rb[i].clone()])
            .collect();
        let joined = join(&rows).expect("joinable");
        let expected: Vec<u8> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        assert_eq!(&joined[..], &expected[..]);
        // The view does not keep the segment handles: it maps the pages itself.
        drop((rows, ra, rb, sa, sb));
        assert_eq!(&joined[..], &expected[..]);
        assert!(Segment::containing(&joined).is_none());
    }

    #[test]
    fn a_joined_column_is_claimed_once_and_writes_stay_out_of_the_segment() {
        let row = MIN_RUN_BYTES;
        let data = vec![5u8; 2 * row];
        let (offsets, len) = layout([row, row]);
        let parts: Vec<&[u8]> = data.chunks(row).collect();
        let seg = Segment::write(&parts, &offsets, len).unwrap();
        let rows = rows_of(&seg, &offsets, row as u64);
        let joined = join(&rows).expect("joinable");
        assert!(
            !BufferPool::global().claim_filled(&joined.slice(1..)),
            "only whole"
        );
        assert!(BufferPool::global().claim_filled(&joined));
        assert!(!BufferPool::global().claim_filled(&joined), "claimed once");
        // The claimer writes through it: the column changes, the segment does not.
        unsafe { *(joined.as_ptr() as *mut u8) = 9 };
        assert_eq!((joined[0], joined[1]), (9, 5));
        assert_eq!(rows[0][0], 5);
        // A new join of the same rows reads the segment's bytes, not the write.
        let again = join(&rows).expect("joinable");
        assert_eq!(again[0], 5);
    }

    #[test]
    fn rows_that_cannot_be_mapped_in_place_are_left_to_copy() {
        let data = vec![7u8; 3 * MIN_RUN_BYTES];
        let (offsets, len) = layout([data.len()]);
        let seg = Segment::write(&[&data], &offsets, len).unwrap();
        let whole = seg.slice(0, data.len() as u64).unwrap();
        // Not at a page offset.
        assert!(join(&[whole.slice(100..100 + MIN_RUN_BYTES)]).is_none());
        // Not whole pages.
        assert!(join(&[whole.slice(0..MIN_RUN_BYTES - 1)]).is_none());
        // Not in a segment.
        assert!(join(&[Bytes::from(vec![0u8; MIN_RUN_BYTES])]).is_none());
        // Runs too short: every 4 KiB row its own mapping.
        let small: Vec<Bytes> = (0..4)
            .map(|i| seg.slice((3 - i) * PAGE, PAGE).unwrap())
            .collect();
        assert!(join(&small).is_none());
        assert!(join(&[] as &[Bytes]).is_none());
        // One run of whole pages joins, even from one segment.
        let one = join(std::slice::from_ref(&whole)).unwrap();
        assert_eq!(&one[..], &data[..]);
    }
}
