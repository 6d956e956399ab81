//! [`SplitAllocator`]: a global allocator for tq's programs (the `tq` command, the Python
//! module) that serves small blocks from mimalloc and large ones from the system allocator.
//!
//! Why: a metadata call allocates thousands of small strings, maps and vectors (a 1024-key
//! lookup decodes 1024 keys on the controller and builds 1024 sample ids on the client), and
//! glibc's `malloc` spent about a third of the client's and the controller's CPU on them
//! (`perf` under Ray, 2026-12-06: `malloc`, `_int_free`, `malloc_consolidate`,
//! `unlink_chunk`). mimalloc serves them from per-thread free lists.
//!
//! Why not mimalloc for everything: payload buffers (the read pool's 4 MiB slabs, 1 MiB cells)
//! came back slower from it: a 1 MiB get under Ray took 6–8 ms with mimalloc for every block
//! against 2.3 ms with glibc, which keeps large freed blocks mapped and hands them back warm.
//! So blocks of [`LARGE`] bytes and more stay with the system allocator.
//!
//! A library never picks the global allocator; programs opt in (feature `mimalloc`):
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOCATOR: tq_core::alloc::SplitAllocator = tq_core::alloc::SplitAllocator;
//! ```
//!
//! Correctness rests on one fact: Rust hands `dealloc` and `realloc` the layout the block was
//! allocated with, so the size that chose the allocator chooses it again on the way back.

use std::alloc::{GlobalAlloc, Layout, System};

/// Blocks of at least this many bytes come from the system allocator: the read pool's
/// smallest pooled buffer, so every pooled buffer is on the system side.
pub const LARGE: usize = crate::buffer::POOL_MIN_BYTES;

/// Small blocks from mimalloc, blocks of [`LARGE`] bytes and more from [`System`].
#[derive(Debug, Default, Clone, Copy)]
pub struct SplitAllocator;

fn is_large(size: usize) -> bool {
    size >= LARGE
}

// SAFETY: every call forwards to the allocator its layout's size selects. A block is
// deallocated and reallocated with the layout it was allocated with (the `GlobalAlloc`
// contract), so it always returns to the allocator it came from; a `realloc` across the
// threshold allocates from the other side, copies and frees, as the contract allows.
unsafe impl GlobalAlloc for SplitAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_large(layout.size()) {
            System.alloc(layout)
        } else {
            mimalloc::MiMalloc.alloc(layout)
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_large(layout.size()) {
            System.alloc_zeroed(layout)
        } else {
            mimalloc::MiMalloc.alloc_zeroed(layout)
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_large(layout.size()) {
            System.dealloc(ptr, layout)
        } else {
            mimalloc::MiMalloc.dealloc(ptr, layout)
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match (is_large(layout.size()), is_large(new_size)) {
            (true, true) => System.realloc(ptr, layout, new_size),
            (false, false) => mimalloc::MiMalloc.realloc(ptr, layout, new_size),
            _ => {
                // SAFETY: the caller guarantees `new_size`, rounded up to the alignment, does
                // not overflow `isize` (the `realloc` contract), and the alignment is valid.
                let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
                let new = self.alloc(new_layout);
                if !new.is_null() {
                    std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                new
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: SplitAllocator = SplitAllocator;

    fn filled(size: usize, align: usize) -> (*mut u8, Layout) {
        let layout = Layout::from_size_align(size, align).unwrap();
        // SAFETY: non-zero size; the block is written within its size.
        unsafe {
            let p = A.alloc(layout);
            assert!(!p.is_null());
            for i in 0..size {
                p.add(i).write((i % 251) as u8);
            }
            (p, layout)
        }
    }

    fn check_pattern(p: *const u8, len: usize) {
        for i in 0..len {
            // SAFETY: `p` holds at least `len` initialised bytes.
            assert_eq!(unsafe { p.add(i).read() }, (i % 251) as u8, "byte {i}");
        }
    }

    #[test]
    fn blocks_on_both_sides_keep_their_alignment() {
        for (size, align) in [
            (24, 8),
            (4096, 4096),
            (LARGE - 1, 64),
            (LARGE, 4096),
            (4 << 20, 4096),
        ] {
            let (p, layout) = filled(size, align);
            assert_eq!(p as usize % align, 0, "{size} bytes aligned to {align}");
            check_pattern(p, size);
            // SAFETY: allocated above with `layout`.
            unsafe { A.dealloc(p, layout) };
        }
    }

    #[test]
    fn zeroed_blocks_are_zero_on_both_sides() {
        for size in [100, LARGE - 8, LARGE, 3 * LARGE] {
            // A block freed dirty just before, so a reused one would show it.
            let (p, layout) = filled(size, 8);
            // SAFETY: allocated above with `layout`.
            unsafe { A.dealloc(p, layout) };
            // SAFETY: non-zero size; read within it, then freed with its layout.
            unsafe {
                let z = A.alloc_zeroed(layout);
                assert!(!z.is_null());
                assert!(
                    (0..size).all(|i| z.add(i).read() == 0),
                    "{size} bytes zeroed"
                );
                A.dealloc(z, layout);
            }
        }
    }

    #[test]
    fn realloc_keeps_the_bytes_within_and_across_the_threshold() {
        // small → small, small → large, large → large, large → small
        let steps = [100, 1000, LARGE + 10, 2 * LARGE, 500];
        let (mut p, mut layout) = filled(steps[0], 16);
        let mut kept = steps[0];
        for &next in &steps[1..] {
            // SAFETY: `p` was allocated with `layout`; the new size is non-zero.
            unsafe {
                p = A.realloc(p, layout, next);
                assert!(!p.is_null());
                assert_eq!(p as usize % 16, 0);
                kept = kept.min(next);
                check_pattern(p, kept);
                layout = Layout::from_size_align(next, 16).unwrap();
                for i in kept..next {
                    p.add(i).write((i % 251) as u8);
                }
                kept = next;
            }
        }
        // SAFETY: the last realloc's block, with its layout.
        unsafe { A.dealloc(p, layout) };
    }

    #[test]
    fn collections_grow_across_the_threshold() {
        // What programs do all the time: a Vec doubling from small to large through realloc.
        let mut v: Vec<u64> = Vec::new();
        for i in 0..(4 * LARGE / 8) as u64 {
            v.push(i);
        }
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
    }
}
