//! Same-host shared memory between a [`super::RemoteUnit`] and a [`super::UnitServer`]
//! (Linux only).
//!
//! A unit server offers a second, local channel beside its network endpoint: an abstract Unix
//! socket (no file to leak when the process dies) that admits only peers presenting a random
//! secret. A client that asks the unit's network endpoint for it ([`ShmOffer`]: socket name,
//! boot id, secret), runs on the same kernel (the same boot id) and can connect moves its
//! payloads there:
//!
//! - **put**: the client writes the cells into a new memfd segment (one `pwritev`, the one copy a
//!   socket write would also make), seals it against writes and resizing, and sends its
//!   descriptor with the request. The unit maps it read-only and stores the cells as slices of
//!   the mapping, so the payload is never copied on the unit's side.
//! - **get**: the unit answers with the descriptors of the segments its cells lie in and each
//!   cell's offset; the client maps them read-only and copies each cell once into the buffer it
//!   assembles (or, without one, keeps a `Bytes` over the mapping: no copy at all); rows of
//!   whole pages come back as views, and a dense column of them is mapped together into one
//!   view of the units' pages ([`joined`]). Cells not in
//!   a segment (written over TCP, or small) travel as frames on the same channel.
//!
//! Lifetimes need no leases: a sealed segment never changes, the kernel keeps its pages while
//! any mapping or descriptor exists in any process, and a process that exits or crashes drops
//! its own. A unit frees a segment when its last cell is cleared and no reader maps it any
//! more; a reader's `Bytes` keeps what it read valid after a clear.
//!
//! Gets known to be small (by the sizes a field's cells had when this stub last put or got
//! them, [`sizes`]) go over the network: for a few kilobytes the channel's exchange costs more
//! than it saves.
//!
//! Anything that does not work out (another host, a refused socket, a unit that offers no
//! channel, a transport error on it) sends the request over the network instead, with one log
//! line saying why, and the client stops trying the channel of that unit.

mod background;
mod channel;
mod fdpass;
pub(crate) mod joined;
mod segment;
mod sizes;
mod spare;
mod unmap;

pub(crate) use channel::{ShmLink, ShmListener};
pub(crate) use segment::{layout, write_sealed, Segment};
pub(crate) use sizes::CellSizes;

pub(super) use super::wire::ShmOffer;

/// Puts smaller than this (in payload bytes per unit request) go over the network: a segment
/// costs a few system calls and one descriptor held by the unit for as long as any of its
/// cells lives.
pub(crate) const MIN_SHARED_PUT: usize = 256 << 10;

/// Most segments one get answer hands over (the kernel's limit of descriptors per message);
/// cells of further segments travel as frames.
pub(crate) const MAX_SEGMENTS_PER_ANSWER: usize = fdpass::MAX_FDS;

/// The kernel's boot id: processes with the same one run on the same kernel and can share
/// memory through a descriptor.
pub(crate) fn host_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Whether the page at `addr` is mapped in this process (`mincore` fails with `ENOMEM` on an
/// unmapped range).
#[cfg(test)]
pub(crate) fn page_is_mapped(addr: *mut libc::c_void) -> bool {
    let mut vec = [0u8; 1];
    unsafe { libc::mincore(addr, 4096, vec.as_mut_ptr()) == 0 }
}
