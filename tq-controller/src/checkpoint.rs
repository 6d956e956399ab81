//! Controller snapshots: the whole control-plane state as bytes, to checkpoint and restore.
//!
//! ```text
//! magic "TQCS" | format u32 LE | body length u64 LE | CRC-32 of the body u32 LE | body
//! ```
//!
//! The body is the postcard encoding of the controller's epoch, unit count and state
//! (partitions with their fields, production and consumption bitmaps, tags, keys, links and
//! backend meta; the index allocator with every generation; leases, with the time each had
//! left), and from format 2 on the samplers' saved states (their cached answers, by name). A reader refuses a newer format, a damaged body (length, checksum, decoding) and a
//! deployment that does not match, before changing anything.

use std::collections::HashMap;
use std::time::Duration;
use tq_core::{Error, LeaseId, Result};

/// The snapshot format this build writes; it reads this one and older.
/// Format 2 added the samplers' cached answers; format 3 the lease that acknowledged each
/// consumed sample (entries of the lease list, so format 2 decodes unchanged); format 4 the
/// answers remembered for requests that must not be applied twice (beside the state); format 5
/// is format 4's layout with the index allocator's free lists and each partition's rows per
/// unit by routing in runs (`tq_core::routing`): a build before it would take those lists for
/// damage, and one of this build sorts an older snapshot's by the new rule as it loads it.
pub const SNAPSHOT_FORMAT: u32 = 5;

const MAGIC: &[u8; 4] = b"TQCS";
const HEADER: usize = 4 + 4 + 8 + 4;

/// What a snapshot holds, for manifests and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct SnapshotCounts {
    pub partitions: u64,
    /// Samples held (visible or being cleared), over all partitions.
    pub samples: u64,
    pub keys: u64,
    /// Leases outstanding (handed out, not acknowledged).
    pub leases: u64,
}

/// Frames `body` (a postcard encoding) as a snapshot.
pub(crate) fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&SNAPSHOT_FORMAT.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    out.extend_from_slice(body);
    out
}

/// The length of the frame at the start of `bytes` (header and body) as its header gives it,
/// or `None` when `bytes` does not start with a whole frame header. Nothing is checked beyond
/// the magic: [`unframe`] checks the rest.
pub(crate) fn frame_len(bytes: &[u8]) -> Option<u64> {
    if bytes.len() < HEADER || &bytes[..4] != MAGIC {
        return None;
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[8..16]);
    u64::from_le_bytes(len).checked_add(HEADER as u64)
}

/// The body of a snapshot, checked: magic, format, length and checksum.
pub(crate) fn unframe(bytes: &[u8]) -> Result<&[u8]> {
    unframe_with_format(bytes).map(|(_, body)| body)
}

/// [`unframe`], with the format the frame was written in.
pub(crate) fn unframe_with_format(bytes: &[u8]) -> Result<(u32, &[u8])> {
    let bad = |why: String| Error::corrupted(format!("controller snapshot: {why}"));
    if bytes.len() < HEADER || &bytes[..4] != MAGIC {
        return Err(bad("not a tq controller snapshot (no `TQCS` header)".into()));
    }
    let word =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let format = word(4);
    if format > SNAPSHOT_FORMAT {
        return Err(Error::invalid(format!(
            "controller snapshot: format {format} is newer than this build reads (up to \
             {SNAPSHOT_FORMAT}); load it with a newer tq"
        )));
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[8..16]);
    let len = u64::from_le_bytes(len);
    let body = &bytes[HEADER..];
    if body.len() as u64 != len {
        return Err(bad(format!(
            "the body is {} bytes, the header says {len}",
            body.len()
        )));
    }
    let (want, got) = (word(16), crc32fast::hash(body));
    if want != got {
        return Err(bad(format!(
            "checksum mismatch (header {want:08x}, body {got:08x}): the snapshot is damaged"
        )));
    }
    Ok((format, body))
}

/// Lease deadlines as the time they had left (an `Instant` means nothing in another process),
/// and the leases that acknowledged consumed samples.
pub(crate) mod deadlines {
    use super::*;

    /// Leases by slot, with their deadlines.
    pub type Leases = crate::partition::LeaseTable;

    /// One saved entry: slot, lease, milliseconds left (or [`ACKNOWLEDGED`]).
    pub type Saved = Vec<(u32, LeaseId, u64)>;

    /// The `ms` of an entry for a slot its lease acknowledged (format 3 on). No outstanding
    /// lease has that much time left (585 million years), so formats 1 and 2, which do not
    /// have such entries, decode the same way.
    pub const ACKNOWLEDGED: u64 = u64::MAX;

    pub fn encode(leases: &Leases, acked_by: &HashMap<u32, LeaseId>) -> Saved {
        let now = tokio::time::Instant::now().into_std();
        let mut saved: Saved = leases
            .iter()
            .map(|(slot, (lease, deadline))| {
                let ms = deadline.saturating_duration_since(now).as_millis();
                (
                    *slot,
                    *lease,
                    u64::try_from(ms)
                        .unwrap_or(ACKNOWLEDGED - 1)
                        .min(ACKNOWLEDGED - 1),
                )
            })
            .collect();
        saved.extend(
            acked_by
                .iter()
                .map(|(slot, lease)| (*slot, *lease, ACKNOWLEDGED)),
        );
        saved
    }

    pub fn decode(saved: Saved) -> (Leases, HashMap<u32, LeaseId>) {
        let now = tokio::time::Instant::now().into_std();
        let mut leases = Leases::new();
        let mut acked_by = HashMap::new();
        for (slot, lease, ms) in saved {
            if ms == ACKNOWLEDGED {
                acked_by.insert(slot, lease);
                continue;
            }
            let deadline = now
                .checked_add(Duration::from_millis(ms))
                .unwrap_or(now + Duration::from_secs(86_400));
            leases.insert(slot, (lease, deadline));
        }
        (leases, acked_by)
    }
}
