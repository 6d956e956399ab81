//! Fresh payload buffers that are cheap to fill.
//!
//! Reading a batch means filling large new buffers (a column packed from rows, a column read
//! from a socket). A fresh allocation of that size is new memory, and on Linux every 4 KiB page
//! of it costs a page fault on first write: on the VMs we measure on, faulting dominated
//! copying (filling 64 MiB took 51 ms with 4 KiB pages and 14 ms with 2 MiB pages). So large
//! buffers ask for transparent huge pages (`madvise(MADV_HUGEPAGE)`; honoured when THP is in
//! `always` or `madvise` mode, harmless otherwise) before anything is written to them.

mod pool;
pub use pool::{BufferPool, PoolBuffer, BUFFER_ALIGN, DEFAULT_POOL_MIB, POOL_MIN_BYTES};

/// Buffers at least this large ask for huge pages; below, the saving is small and the buffer
/// may share pages with other allocations.
pub const HUGE_PAGE_MIN_BYTES: usize = 4 << 20;

/// A zero-filled buffer of `len` bytes, backed by huge pages where the system allows it.
pub fn zeroed(len: usize) -> Vec<u8> {
    // Large zeroed allocations come straight from the kernel (calloc → mmap): untouched pages,
    // so advice given now applies to every page.
    let buf = vec![0u8; len];
    if len >= HUGE_PAGE_MIN_BYTES {
        advise_huge_pages(buf.as_ptr() as usize, buf.len());
    }
    buf
}

/// [`zeroed`] as a `BytesMut` (same allocation, no copy), for buffers split into pieces.
pub fn zeroed_mut(len: usize) -> bytes::BytesMut {
    bytes::BytesMut::from(bytes::Bytes::from(zeroed(len)))
}

/// A copy of `src` in new memory of exactly its length that belongs to the result alone: for
/// bytes that may stay in a store for long (not pooled, no slack). A large copy lands on huge
/// pages where the system allows, so that it costs about one pass over the bytes instead of a
/// page fault per 4 KiB (a 32 MiB numpy column put into an embedded store took 16 ms through
/// malloc's fresh pages against 5 ms for a copy into warm memory).
pub fn copied(src: &[u8]) -> bytes::Bytes {
    if src.len() < HUGE_PAGE_MIN_BYTES {
        return bytes::Bytes::copy_from_slice(src);
    }
    let mut buf = zeroed(src.len());
    buf.copy_from_slice(src);
    buf.into()
}

/// `parts` copied one after another into one new buffer of their total length. Buffers of
/// [`POOL_MIN_BYTES`] or more come from the process-wide [`BufferPool`].
pub fn concatenated<'a>(parts: impl Iterator<Item = &'a [u8]> + Clone) -> bytes::Bytes {
    let total: usize = parts.clone().map(<[u8]>::len).sum();
    if total < POOL_MIN_BYTES {
        // Small: a plain append, without zeroing first.
        let mut buf = Vec::with_capacity(total);
        parts.for_each(|p| buf.extend_from_slice(p));
        return buf.into();
    }
    BufferPool::global().concatenated(parts)
}

#[cfg(target_os = "linux")]
fn advise_huge_pages(addr: usize, len: usize) {
    const HUGE: usize = 2 << 20;
    let start = addr.next_multiple_of(HUGE);
    let end = (addr + len) / HUGE * HUGE;
    if end > start {
        // SAFETY: advisory only; the range lies inside memory the caller owns, and
        // MADV_HUGEPAGE neither changes contents nor unmaps anything. A failure (THP disabled,
        // old kernel) just leaves normal pages.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_addr: usize, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_buffers_are_zero_and_of_the_asked_length() {
        for len in [0, 1, 4095, HUGE_PAGE_MIN_BYTES, HUGE_PAGE_MIN_BYTES + 12345] {
            let b = zeroed(len);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
            assert_eq!(zeroed_mut(len).len(), len);
        }
    }

    #[test]
    fn copied_is_an_equal_buffer_of_its_own() {
        assert!(copied(&[]).is_empty());
        for len in [7, HUGE_PAGE_MIN_BYTES + 3] {
            let src: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let copy = copied(&src);
            assert_eq!(&copy[..], &src[..]);
            assert_ne!(copy.as_ptr(), src.as_ptr());
            // Its own: convertible to a mutable buffer without another copy.
            let ptr = copy.as_ptr();
            let mutable = copy.try_into_mut().expect("a copy is unique");
            assert_eq!(mutable.as_ptr(), ptr);
        }
    }

    #[test]
    fn concatenated_keeps_every_part_in_order() {
        for sizes in [
            vec![3usize, 0, 5],
            vec![HUGE_PAGE_MIN_BYTES / 2 + 7, HUGE_PAGE_MIN_BYTES / 2],
        ] {
            let parts: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| vec![i as u8 + 1; n])
                .collect();
            let joined = concatenated(parts.iter().map(Vec::as_slice));
            assert_eq!(joined.to_vec(), parts.concat());
        }
    }
}
