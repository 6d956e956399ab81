//! Columns joined from cells of several segments without copying them.
//!
//! A dense column a same-host get returns is one buffer, but its rows lie in the segments of
//! several units (runs of rows alternate between units) or of several puts. Instead of copying
//! each row into a fresh buffer, the client finds one free range of addresses and maps each
//! row's pages of its segment at the row's place in it, then maps the pages in by reading one
//! byte of each ([`map_runs`] says why this way): the column is contiguous and made of the
//! units' own pages. That needs rows of whole pages at page offsets ([`super::layout`] places
//! them so) and costs one mapping per run of rows that lie back to back in one segment, so rows
//! shorter than [`MIN_RUN_BYTES`] on average are copied instead: mappings are a per-process
//! resource (`vm.max_map_count`, 65530 by default).
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
    // A range of addresses the pieces can land in side by side: reserved, then freed, and the
    // pieces mapped into it only where it is still free (`MAP_FIXED_NOREPLACE`). Mapping them
    // over the reservation instead (`MAP_FIXED`) makes the kernel unmap and split the
    // reservation once per piece, which cost a 1024 x 4 KiB get (64 pieces) 3-6 % more
    // (docs/benchmarks/log/2026-12-07-1024-joined-columns-fault-in.md). Another thread may map
    // something into the freed range meanwhile; then the column is mapped over a reservation
    // after all.
    let addr = reserve(total)?;
    unsafe { libc::munmap(addr, total) };
    let joined = if map_into_free_range(addr, runs) {
        Joined { addr, len: total }
    } else {
        let addr = reserve(total)?;
        // Owns the range from here: dropping it unmaps whatever was mapped.
        let joined = Joined { addr, len: total };
        if map_runs_from(addr, runs, libc::MAP_FIXED).is_err() {
            tracing::debug!(runs = runs.len(), error = %std::io::Error::last_os_error(), "cannot map a joined column; copying");
            return None;
        }
        joined
    };
    fault_in(joined.addr, total);
    BufferPool::global().register_unclaimed(joined.addr as *const u8, total);
    Some(Bytes::from_owner(joined))
}

/// `len` bytes of addresses nothing else will be mapped at, or `None` (logged) when the
/// kernel refuses.
fn reserve(len: usize) -> Option<*mut libc::c_void> {
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        tracing::debug!(bytes = len, error = %std::io::Error::last_os_error(), "cannot reserve a joined column; copying");
        return None;
    }
    Some(addr)
}

/// Maps `run` at exactly `target` with `placement` (`MAP_FIXED` or `MAP_FIXED_NOREPLACE`);
/// false when the kernel put it anywhere else or nowhere.
fn map_run_at(target: *mut libc::c_void, run: &Run, placement: libc::c_int) -> bool {
    let mapped = unsafe {
        libc::mmap(
            target,
            run.len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            // Copy-on-write; no swap reserved for pages that are never written.
            libc::MAP_PRIVATE | placement | libc::MAP_NORESERVE,
            run.segment.fd().as_raw_fd(),
            run.offset as libc::off_t,
        )
    };
    if mapped != target && mapped != libc::MAP_FAILED {
        // A kernel older than 4.17 takes MAP_FIXED_NOREPLACE for a hint and may map the run
        // elsewhere.
        unsafe { libc::munmap(mapped, run.len as usize) };
    }
    mapped == target
}

/// Maps the runs one after the other from `addr` with `placement`. On the first run that does
/// not land where it should: `Err` with how many bytes from `addr` the runs before it took.
fn map_runs_from(
    addr: *mut libc::c_void,
    runs: &[Run],
    placement: libc::c_int,
) -> Result<(), usize> {
    let mut at = 0usize;
    for run in runs {
        let target = unsafe { (addr as *mut u8).add(at) } as *mut libc::c_void;
        if !map_run_at(target, run, placement) {
            return Err(at);
        }
        at += run.len as usize;
    }
    Ok(())
}

/// Maps the runs from `addr`, a range nothing is mapped at (freed just before), never over
/// anything mapped there meanwhile. False, with nothing of it left mapped, as soon as one run
/// does not land where it should.
fn map_into_free_range(addr: *mut libc::c_void, runs: &[Run]) -> bool {
    match map_runs_from(addr, runs, libc::MAP_FIXED_NOREPLACE) {
        Ok(()) => true,
        Err(mapped) => {
            if mapped > 0 {
                // SAFETY: only the runs this call mapped are there, and nothing holds them.
                unsafe { libc::munmap(addr, mapped) };
            }
            false
        }
    }
}

/// Maps the column's pages in now, by reading one byte of each page: each read that faults
/// maps the 16 pages around it (the kernel's fault-around), the others find their page
/// mapped. `MADV_POPULATE_READ` maps the same pages but walks every page through
/// `get_user_pages`; a get read this way took 11-14 % less time for 1024 x 4 KiB rows and 20 %
/// less for 32 x 1 MiB (the log above). Safe to read: every run lies within its segment,
/// which is sealed against shrinking ([`Segment::map`]), so no page is past its end.
fn fault_in(addr: *mut libc::c_void, len: usize) {
    let mut at = 0usize;
    while at < len {
        // SAFETY: `addr..addr + len` is mapped readable (the runs just mapped).
        unsafe { std::ptr::read_volatile((addr as *const u8).add(at)) };
        at += PAGE as usize;
    }
}

#[cfg(test)]
mod tests {
    use super::super::{page_is_mapped, segment::layout};
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

    fn two_runs() -> (Vec<u8>, Vec<Run>) {
        let row = MIN_RUN_BYTES;
        let data: Vec<u8> = (0..2 * row).map(|i| (i / 4096) as u8).collect();
        let (offsets, len) = layout([row, row]);
        let parts: Vec<&[u8]> = data.chunks(row).collect();
        let segment = Segment::write(&parts, &offsets, len).unwrap();
        // Swapped: the column is the second row, then the first.
        let runs = offsets
            .iter()
            .rev()
            .map(|&offset| Run {
                segment: segment.clone(),
                offset,
                len: row as u64,
            })
            .collect();
        let swapped = [&data[row..], &data[..row]].concat();
        (swapped, runs)
    }

    #[test]
    fn runs_never_land_over_what_was_mapped_into_the_freed_range_meanwhile() {
        let (_, runs) = two_runs();
        let row = MIN_RUN_BYTES;
        // The range is free for the first run; its second half has been taken by another
        // mapping, as another thread's could be between the reservation's release and the runs.
        let addr = reserve(2 * row).unwrap();
        let taken = unsafe { (addr as *mut u8).add(row) } as *mut libc::c_void;
        unsafe {
            libc::munmap(addr, row);
            let other = libc::mmap(
                taken,
                row,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
            assert_eq!(other, taken);
            *(taken as *mut u8) = 0xAB;
        }
        assert!(!map_into_free_range(addr, &runs));
        assert!(
            !page_is_mapped(addr),
            "the run it had mapped is unmapped again"
        );
        assert_eq!(
            unsafe { *(taken as *const u8) },
            0xAB,
            "the other mapping is untouched"
        );
        unsafe { libc::munmap(taken, row) };
    }

    #[test]
    fn runs_mapped_either_way_read_as_the_column() {
        let (expected, runs) = two_runs();
        let total = expected.len();
        let free = reserve(total).unwrap();
        unsafe { libc::munmap(free, total) };
        assert!(map_into_free_range(free, &runs));
        let reserved = reserve(total).unwrap();
        assert_eq!(map_runs_from(reserved, &runs, libc::MAP_FIXED), Ok(()));
        for addr in [free, reserved] {
            fault_in(addr, total);
            let column = unsafe { std::slice::from_raw_parts(addr as *const u8, total) };
            assert_eq!(column, &expected[..]);
            unsafe { libc::munmap(addr, total) };
        }
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
