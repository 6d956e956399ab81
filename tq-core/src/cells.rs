//! Copies of stored cells, for checkpoints of storage that keeps payloads in its own units.
//!
//! A KV store outlives the processes that use it, so a checkpoint of a KV deployment only
//! records where the data is. Storage units (in memory or on a local SSD) die with their
//! process, so a checkpoint must copy their cells, consistently with the controller state it
//! saves next to them. [`PayloadCheckpoint`] is how the checkpoint code asks a storage backend
//! for that copy, in three steps per unit:
//!
//! 1. **hold**: the unit makes new puts and clears wait (reads and merges go on). Holding every
//!    unit *before* the controller's state is taken is what makes the copy consistent: a sample
//!    the controller marks produced had its cells written before it was marked, so before the
//!    snapshot, and nothing can delete them until the copy is taken.
//! 2. **capture**: the unit takes a copy-on-write view of every cell (in-memory cells are
//!    reference-counted buffers, so this costs a map walk, not a copy; an SSD unit reads its
//!    disk cells here) and lifts the hold. The write pause lasts from the hold to this point.
//! 3. **page** through the capture at leisure, then **release** it.
//!
//! A hold that is never followed by a capture (the checkpointing process died) lifts itself
//! after its time to live, so writers never wait for ever.
//!
//! A KV deployment can also ask for its payloads to be copied ([`PayloadCopy`]): the store
//! is shared by writers in many processes, so the hold is the controller's (clears and
//! overwrites wait; see the checkpoint code), and the backend only reads and writes the cells
//! the controller state names.

use crate::{BatchMeta, FieldName, Result, SampleId, Value};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Some cells of one field: `values[i]` is the cell of `samples[i]`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FieldCells {
    pub field: FieldName,
    pub samples: Vec<SampleId>,
    pub values: Vec<Value>,
}

impl FieldCells {
    /// Payload bytes of these cells.
    pub fn nbytes(&self) -> u64 {
        self.values.iter().map(|v| v.nbytes() as u64).sum()
    }
}

/// What a unit captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CaptureInfo {
    /// Names the capture in later page and release calls.
    pub id: u64,
    pub cells: u64,
    pub bytes: u64,
}

/// A run of a capture's cells, in (field, sample index) order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CellPage {
    pub fields: Vec<FieldCells>,
    /// The offset (in cells) of the next page; `None` after the last one.
    pub next: Option<u64>,
}

/// How long a hold lasts unless a capture lifts it first.
pub const DEFAULT_HOLD_TTL: Duration = Duration::from_secs(60);

/// Cuts a page out of captured cells: those from cell `offset` on (counting through the fields
/// in order), up to about `max_bytes` of payload (always at least one cell).
pub fn page_of(captured: &[FieldCells], offset: u64, max_bytes: u64) -> CellPage {
    let mut page = CellPage::default();
    let mut skip = offset;
    let mut bytes = 0u64;
    let mut taken = 0u64;
    for fc in captured {
        let n = fc.values.len() as u64;
        if skip >= n {
            skip -= n;
            continue;
        }
        let start = skip as usize;
        skip = 0;
        let mut end = start;
        while end < fc.values.len() {
            let size = fc.values[end].nbytes() as u64;
            if taken > 0 && bytes + size > max_bytes {
                break;
            }
            bytes += size;
            taken += 1;
            end += 1;
        }
        if end > start {
            page.fields.push(FieldCells {
                field: fc.field.clone(),
                samples: fc.samples[start..end].to_vec(),
                values: fc.values[start..end].to_vec(),
            });
        }
        if end < fc.values.len() {
            page.next = Some(offset + taken);
            return page;
        }
    }
    page
}

/// The copy of a backend's own payloads that a checkpoint takes (see the module docs). A
/// backend whose payloads live in a shared store that outlives the job (the KV adapter) has
/// none: [`crate::StorageManager::payload_checkpoint`] answers `None` for it.
///
/// Parts are numbered `0..parts()`, in routing order: a checkpoint is loaded into a deployment
/// with as many parts, and part `i`'s cells go back to part `i`.
#[async_trait::async_trait]
pub trait PayloadCheckpoint: Send + Sync {
    /// How many parts (storage units) hold cells.
    fn parts(&self) -> usize;

    /// Step 1 on every part: new puts and clears wait until the capture or for `ttl`.
    async fn hold(&self, ttl: Duration) -> Result<()>;

    /// Step 2 on every part: capture every cell and lift the hold. One entry per part.
    async fn capture(&self) -> Result<Vec<CaptureInfo>>;

    /// Step 3: cells of part `part`'s capture `capture` from cell `offset` on, about
    /// `max_bytes` of them.
    async fn page(
        &self,
        part: usize,
        capture: u64,
        offset: u64,
        max_bytes: u64,
    ) -> Result<CellPage>;

    /// Forgets the captures (and lifts any hold still in place). Best effort.
    async fn release(&self, captures: &[CaptureInfo]);

    /// Cells stored per part (a checkpoint is loaded only into empty parts).
    async fn stored_cells(&self) -> Result<Vec<u64>>;

    /// Follows the controller into `epoch` before cells are loaded (a checkpoint's epoch), so
    /// that parts in other processes accept them.
    async fn enter_epoch(&self, epoch: u64) -> Result<()>;

    /// Writes loaded cells back into part `part`.
    async fn load(&self, part: usize, cells: Vec<FieldCells>) -> Result<()>;
}

/// What a page of copied payloads holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CopiedCells {
    pub cells: u64,
    /// Payload bytes as stored (values with their headers).
    pub bytes: u64,
}

/// A copy of payloads that stay in a shared store (the KV adapter's), taken into a checkpoint
/// on request and written back when it is loaded. The pages are the backend's own encoding:
/// the checkpoint code stores them, checksums them and hands them back unchanged.
///
/// Consistency is the caller's business: it reads what a controller snapshot names while the
/// controller holds clears and overwrites, so every cell named is still stored.
#[async_trait::async_trait]
pub trait PayloadCopy: Send + Sync {
    /// Reads every cell the backend meta of `meta` names (each sample's own stored cells; a
    /// linked field has none) and encodes them, with what is needed to write them back, as
    /// one page, given as parts that make the page back to back (the values as read, not
    /// copied into one buffer). A named cell that is not stored is `DataLost`, naming it.
    async fn export(&self, meta: &BatchMeta) -> Result<(Vec<bytes::Bytes>, CopiedCells)>;

    /// Decodes a page and checks that this storage can take it back (its stores exist),
    /// writing nothing. `what` names the page in errors.
    fn check(&self, page: &bytes::Bytes, what: &str) -> Result<CopiedCells>;

    /// Writes a page's cells back under the keys of controller epoch `epoch` (the epoch the
    /// loading controller was given: a fresh one, in which the store holds no key yet), over
    /// whatever the store holds under those keys.
    async fn import(&self, page: bytes::Bytes, epoch: u64, what: &str) -> Result<CopiedCells>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn cells(field: &str, n: u32, size: usize) -> FieldCells {
        FieldCells {
            field: field.into(),
            samples: (0..n).map(|i| SampleId::new(i, 1)).collect(),
            values: (0..n)
                .map(|_| Value::Object(Bytes::from(vec![0u8; size])))
                .collect(),
        }
    }

    #[test]
    fn pages_cover_every_cell_once_in_order() {
        let captured = vec![cells("a", 5, 10), cells("b", 3, 25)];
        let mut seen = Vec::new();
        let mut offset = Some(0);
        while let Some(o) = offset {
            let page = page_of(&captured, o, 30);
            assert!(!page.fields.is_empty(), "a page holds at least one cell");
            for f in &page.fields {
                for s in &f.samples {
                    seen.push((f.field.clone(), s.index));
                }
            }
            offset = page.next;
        }
        let want: Vec<_> = (0..5)
            .map(|i| ("a".to_string(), i))
            .chain((0..3).map(|i| ("b".to_string(), i)))
            .collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn a_cell_larger_than_the_page_still_makes_progress() {
        let captured = vec![cells("a", 2, 100)];
        let first = page_of(&captured, 0, 10);
        assert_eq!(first.fields[0].values.len(), 1);
        assert_eq!(first.next, Some(1));
        let second = page_of(&captured, 1, 10);
        assert_eq!(second.next, None);
        assert!(page_of(&captured, 2, 10).fields.is_empty());
    }
}
