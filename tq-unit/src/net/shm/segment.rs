//! Sealed memfd segments: what a same-host put hands to a unit and a same-host get maps.
//!
//! A segment is written once by its creator (with `pwritev`, no mapping of its own), then
//! sealed against writes, growth and shrinking before its descriptor leaves the process. A
//! receiver refuses a segment without those seals: a writer could otherwise change cells the
//! unit has stored and acknowledged, or truncate the file under a mapping (a `SIGBUS` in the
//! reader). Sealed, a mapping of it is immutable for everyone, so a reader needs no lease: the
//! kernel keeps the pages while any mapping or descriptor of the segment exists, and a process
//! that crashes loses its mappings and descriptors with it, so nothing leaks.

use bytes::Bytes;
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, Weak};
use tq_core::{Error, Result};

/// The seals every segment carries before it is handed over.
const SEALS: libc::c_int =
    libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;

/// Most iovecs one `pwritev` takes (Linux's `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// Cells start at multiples of this offset in a segment, so tensors mapped from it are
/// aligned for any dtype and vector loads.
pub(crate) const CELL_ALIGN: u64 = 64;

/// The page size mappings are made of (x86-64 and most aarch64 kernels; [`page_size_is_expected`] checks).
pub(crate) const PAGE: u64 = 4096;

/// Whether this kernel maps in [`PAGE`]s; where it does not, nothing is joined.
pub(crate) fn page_size_is_expected() -> bool {
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as u64 == PAGE }
}

/// A sealed segment mapped read-only in this process, with its descriptor (to hand on).
pub(crate) struct Segment {
    fd: OwnedFd,
    addr: *mut libc::c_void,
    len: usize,
}

// The mapping is read-only and immutable (sealed); the pointer is only read through.
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

impl Segment {
    /// A new sealed segment holding `parts` back to back, each at the offset `layout` gives
    /// (see [`layout`]), and mapped here.
    #[cfg(test)]
    pub(crate) fn write(parts: &[&[u8]], offsets: &[u64], len: u64) -> Result<Arc<Segment>> {
        Segment::map(write_sealed(parts, offsets, len)?)
    }

    /// Maps a segment received from a peer, after checking its seals.
    pub(crate) fn map(fd: OwnedFd) -> Result<Arc<Segment>> {
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & SEALS != SEALS {
            return Err(Error::invalid(
                "shared-memory segment is not sealed against writes and resizing (a sender must \
                 seal a segment before handing it over)",
            ));
        }
        let len = file_len(&fd)?;
        if len == 0 {
            return Err(Error::invalid("shared-memory segment is empty"));
        }
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(os_error("mmap of a shared-memory segment"));
        }
        let segment = Arc::new(Segment { fd, addr, len });
        registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr as usize, Arc::downgrade(&segment));
        Ok(segment)
    }

    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    fn bytes(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// `len` bytes at `offset` as a `Bytes` that keeps the segment mapped while it lives.
    pub(crate) fn slice(self: &Arc<Self>, offset: u64, len: u64) -> Result<Bytes> {
        let end = offset.checked_add(len).filter(|e| *e <= self.len as u64);
        let Some(end) = end else {
            return Err(Error::corrupted(format!(
                "a cell at {offset}+{len} lies outside its {}-byte shared-memory segment",
                self.len
            )));
        };
        Ok(Bytes::from_owner(Held(self.clone())).slice(offset as usize..end as usize))
    }

    /// Asks the kernel to map the pages of `offset..offset + len` now, in one call, instead
    /// of a fault per page on first touch. Best effort: older kernels do not know the advice.
    pub(crate) fn populate(&self, offset: u64, len: u64) {
        const MADV_POPULATE_READ: libc::c_int = 22;
        let page = 4096u64;
        let start = offset / page * page;
        let end = (offset + len).min(self.len as u64);
        if end <= start {
            return;
        }
        unsafe {
            libc::madvise(
                (self.addr as *mut u8).add(start as usize) as *mut libc::c_void,
                (end - start) as usize,
                MADV_POPULATE_READ,
            );
        }
    }

    /// The segment `bytes` lies in, and its offset there, when it is a slice of a segment
    /// mapped in this process.
    pub(crate) fn containing(bytes: &Bytes) -> Option<(Arc<Segment>, u64)> {
        let at = bytes.as_ptr() as usize;
        let registry = registry().lock().unwrap_or_else(|p| p.into_inner());
        let (_, weak) = registry.range(..=at).next_back()?;
        let segment = weak.upgrade()?;
        let offset = segment.offset_of(bytes)?;
        Some((segment, offset))
    }

    /// Where `bytes` starts in this segment's mapping, when it lies wholly inside it.
    pub(crate) fn offset_of(&self, bytes: &[u8]) -> Option<u64> {
        let offset = (bytes.as_ptr() as usize).checked_sub(self.addr as usize)?;
        (offset + bytes.len() <= self.len).then_some(offset as u64)
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        let mut registry = registry().lock().unwrap_or_else(|p| p.into_inner());
        // Only this segment's entry: a new mapping at the same address replaces it only
        // after the unmap, which happens after this (on the unmapping thread).
        registry.remove(&(self.addr as usize));
        drop(registry);
        super::unmap::unmap_later(self.addr, self.len);
    }
}

/// A segment kept alive by a `Bytes`.
struct Held(Arc<Segment>);

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

/// Live segments of this process by mapping address, to find the segment a stored cell
/// lies in (a `Bytes` cannot give its owner back).
fn registry() -> &'static Mutex<BTreeMap<usize, Weak<Segment>>> {
    static REGISTRY: Mutex<BTreeMap<usize, Weak<Segment>>> = Mutex::new(BTreeMap::new());
    &REGISTRY
}

/// Where each of `lens` starts in a segment, and the segment's length. A cell of whole pages
/// starts on a page, so a reader can map it next to cells of other segments and hand out a
/// column of them without copying (see [`super::joined`]).
pub(crate) fn layout(lens: impl IntoIterator<Item = usize>) -> (Vec<u64>, u64) {
    let mut at = 0u64;
    let offsets = lens
        .into_iter()
        .map(|len| {
            let align = if len > 0 && (len as u64).is_multiple_of(PAGE) {
                PAGE
            } else {
                CELL_ALIGN
            };
            let here = at.div_ceil(align) * align;
            at = here + len as u64;
            here
        })
        .collect();
    (offsets, at.max(1))
}

/// A new segment of `len` bytes holding each of `parts` at its offset (see [`layout`]),
/// sealed, not mapped here: what a put hands to a unit.
pub(crate) fn write_sealed<P: AsRef<[u8]>>(
    parts: &[P],
    offsets: &[u64],
    len: u64,
) -> Result<OwnedFd> {
    let fd = match super::spare::take(len) {
        Some(fd) => fd,
        None => create(len)?,
    };
    write_parts(&fd, parts, offsets)?;
    seal(&fd)?;
    Ok(fd)
}

pub(super) fn create(len: u64) -> Result<OwnedFd> {
    let name = c"tq-cells";
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(os_error("memfd_create"));
    }
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(os_error(&format!(
            "sizing a {len}-byte shared-memory segment"
        )));
    }
    Ok(fd)
}

/// Writes each part at its offset: one `pwritev` per run of parts with no padding between.
fn write_parts<P: AsRef<[u8]>>(fd: &OwnedFd, parts: &[P], offsets: &[u64]) -> Result<()> {
    let mut i = 0;
    while i < parts.len() {
        let start = offsets[i];
        let mut at = start;
        let mut iov = Vec::new();
        while i < parts.len() && offsets[i] == at && iov.len() < IOV_MAX {
            let part = parts[i].as_ref();
            iov.push(libc::iovec {
                iov_base: part.as_ptr() as *mut libc::c_void,
                iov_len: part.len(),
            });
            at += part.len() as u64;
            i += 1;
        }
        write_all_at(fd, &mut iov, start)?;
    }
    Ok(())
}

fn write_all_at(fd: &OwnedFd, iov: &mut [libc::iovec], mut offset: u64) -> Result<()> {
    let mut iov = iov;
    while !iov.is_empty() {
        let n = unsafe {
            libc::pwritev(
                fd.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                offset as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::unavailable(format!(
                "writing a shared-memory segment: {e}"
            )));
        }
        let mut n = n as usize;
        offset += n as u64;
        while let Some(first) = iov.first_mut() {
            if n >= first.iov_len {
                n -= first.iov_len;
                iov = &mut iov[1..];
            } else {
                first.iov_base = unsafe { (first.iov_base as *mut u8).add(n) } as *mut libc::c_void;
                first.iov_len -= n;
                break;
            }
        }
    }
    Ok(())
}

fn seal(fd: &OwnedFd) -> Result<()> {
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
        return Err(os_error("sealing a shared-memory segment"));
    }
    Ok(())
}

fn file_len(fd: &OwnedFd) -> Result<usize> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(os_error("fstat of a shared-memory segment"));
    }
    Ok(st.st_size as usize)
}

fn os_error(what: &str) -> Error {
    Error::unavailable(format!("{what}: {}", std::io::Error::last_os_error()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_parts_read_back_at_their_offsets() {
        let a = vec![1u8; 100];
        let b = vec![2u8; 5000];
        let c = vec![3u8; 7];
        let (offsets, len) = layout([a.len(), b.len(), c.len()]);
        assert_eq!(offsets, vec![0, 128, 5184]);
        let seg = Segment::write(&[&a, &b, &c], &offsets, len).unwrap();
        assert_eq!(seg.slice(offsets[1], 5000).unwrap(), Bytes::from(b.clone()));
        assert_eq!(seg.slice(offsets[2], 7).unwrap(), Bytes::from(c));
        let cell = seg.slice(offsets[0], 100).unwrap();
        let (found, at) = Segment::containing(&cell).unwrap();
        assert!(Arc::ptr_eq(&found, &seg));
        assert_eq!(at, 0);
        assert!(seg.slice(len, 1).is_err(), "a cell past the end is refused");
        assert!(Segment::containing(&Bytes::from(a)).is_none());
    }

    #[test]
    fn cells_of_whole_pages_start_on_a_page() {
        let (offsets, len) = layout([100, 8192, 7, 4096, 0]);
        assert_eq!(offsets, vec![0, 4096, 12288, 16384, 20480]);
        assert_eq!(len, 20480);
    }

    #[test]
    fn an_unsealed_segment_is_refused() {
        let fd = create(4096).unwrap();
        let err = Segment::map(fd).err().unwrap();
        assert!(err.message().contains("not sealed"), "{err}");
    }

    #[test]
    fn a_mapping_outlives_the_segment_handle_through_its_bytes() {
        let data = vec![9u8; 10_000];
        let (offsets, len) = layout([data.len()]);
        let seg = Segment::write(&[&data], &offsets, len).unwrap();
        let cell = seg.slice(0, 10_000).unwrap();
        drop(seg);
        assert_eq!(&cell[..], &data[..]);
        let (found, _) = Segment::containing(&cell).unwrap();
        drop(found);
        drop(cell);
    }
}
