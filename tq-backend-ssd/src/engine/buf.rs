//! Read buffers.
//!
//! A read lands in a heap buffer that is not zeroed first (the read fills it; only a completely
//! filled buffer is handed out). Measured on the benchmark machine, fresh anonymous mappings per
//! read (unmapped on drop, so never retained by the allocator) made reads 2-4x slower than
//! `std::fs::read` because every read paid page faults and zeroing; heap buffers reuse warm
//! memory. What the allocator keeps after a clear is returned by `malloc_trim` (see
//! `SsdConfig::trim_after_clear` and docs/ssd.md for the RSS figures).

use bytes::Bytes;

/// A buffer being filled by a read; becomes [`Bytes`] without a copy.
#[derive(Debug)]
pub struct ReadBuf {
    buf: Vec<u8>,
    len: usize,
}

impl ReadBuf {
    /// A buffer for `len` bytes (uninitialised until filled).
    pub fn new(len: usize) -> std::io::Result<ReadBuf> {
        Ok(ReadBuf {
            buf: Vec::with_capacity(len),
            len,
        })
    }

    /// Where the bytes go.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.buf.as_mut_ptr()
    }

    /// The number of bytes to fill.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Hands the buffer over as `Bytes`.
    ///
    /// # Safety
    /// All `len()` bytes must have been written.
    pub unsafe fn assume_filled(mut self) -> Bytes {
        // SAFETY: the caller guarantees the first `len` bytes are initialised; capacity ≥ len.
        unsafe { self.buf.set_len(self.len) };
        Bytes::from(self.buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filled_buffers_round_trip() {
        for len in [0usize, 10, 1 << 20] {
            let mut b = ReadBuf::new(len).unwrap();
            assert_eq!(b.len(), len);
            let p = b.as_mut_ptr();
            for i in 0..len {
                // SAFETY: within capacity.
                unsafe { p.add(i).write(i as u8) };
            }
            // SAFETY: every byte written above.
            let bytes = unsafe { b.assume_filled() };
            assert_eq!(bytes.len(), len);
            assert!(bytes.iter().enumerate().all(|(i, x)| *x == i as u8));
        }
    }
}
