//! Storage units over the network (feature `net`): [`UnitServer`] serves any
//! [`crate::StorageUnit`] (in memory, or the SSD unit) on a tq-net endpoint and [`RemoteUnit`]
//! is the stub a manager uses to reach it. They sit beside the trait, as the controller's server
//! and stub sit beside the controller; tq-backend-simple re-exports them.
//!
//! A request is one postcard header describing the cells (kind, dtype, shape: once per field
//! when its rows agree, as a dense column's do, else per cell) plus one body frame per cell
//! carrying its raw bytes. Payloads never pass through the encoder: they go out
//! as vectored writes of the stored `Bytes` and arrive as slices of the one receive buffer, which
//! the receiving unit stores directly (zero copy, tracked as one shared allocation per field).

mod remote;
mod server;
#[cfg(target_os = "linux")]
mod shm;
mod wire;

pub use remote::RemoteUnit;
pub use server::{UnitFactory, UnitServer};

/// `rows` (views a same-host get returned) back to back as one `Bytes` made of the storage
/// units' own shared-memory pages, without copying them; `None` when they cannot be joined that
/// way (not all in shared memory, not whole pages, rows too short to be worth a mapping each,
/// the kernel refusing) and the caller should copy. See the module `shm::joined`.
pub fn join_shared_rows<'a, I>(rows: I) -> Option<bytes::Bytes>
where
    I: IntoIterator<Item = &'a bytes::Bytes>,
    I::IntoIter: Clone,
{
    #[cfg(target_os = "linux")]
    return shm::joined::join(rows);
    #[cfg(not(target_os = "linux"))]
    {
        let _ = rows;
        None
    }
}

/// Whether `bytes` lies in a shared-memory segment mapped in this process: in a reader, a row
/// a same-host get returned (a cheap test before collecting a column's rows for
/// [`join_shared_rows`]); in a unit, a cell a same-host client put through the channel (the
/// memory unit frees those behind a clear's answer).
pub fn in_shared_memory(bytes: &bytes::Bytes) -> bool {
    #[cfg(target_os = "linux")]
    return shm::Segment::containing(bytes).is_some();
    #[cfg(not(target_os = "linux"))]
    {
        let _ = bytes;
        false
    }
}
