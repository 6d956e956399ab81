//! Accounting for shared allocations ("blocks") inside one storage unit.
//!
//! A block is the set of cells of one field that one request stored as zero-copy slices of a
//! single allocation (a dense column's buffer, or one received frame). While any of those cells
//! is alive the whole allocation stays alive, so the table tracks, per block, how many bytes the
//! block pins (`total_bytes`) and how many of them are still referenced by live cells
//! (`live_bytes`). When a cell leaves a block (clear, overwrite, generation purge, update) and the
//! live fraction falls below the unit's compaction threshold, the block is queued for compaction:
//! the unit copies the survivors into owned buffers, after which the allocation can be freed.
//!
//! The table is plain data guarded by the unit's lock; it never copies payloads itself.

use crate::index::IndexHasher;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use tq_core::FieldName;

/// Identifies one block within a unit. Never reused.
pub(crate) type BlockId = u64;

#[derive(Debug)]
struct Block {
    field: FieldName,
    /// Sample indexes whose cell (of `field`) was stored as part of this block.
    members: Vec<u32>,
    /// Bytes of the allocation this block keeps alive (as far as this unit can see it).
    total_bytes: u64,
    /// Bytes of that allocation still referenced by live cells.
    live_bytes: u64,
    live_cells: usize,
    /// Queued for or undergoing compaction: do not queue it twice.
    compacting: bool,
}

/// Work handed to the unit when it compacts a block: copy these members of `field` out.
#[derive(Debug)]
pub(crate) struct CompactionJob {
    pub field: FieldName,
    pub members: Vec<u32>,
}

/// Aggregate counters over the table, reported in `UnitStats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct BlockCounters {
    pub blocks: usize,
    pub retained_bytes: u64,
    pub live_bytes: u64,
    pub compactions: u64,
    pub compacted_bytes: u64,
}

/// Every block of one unit, plus the compaction policy.
#[derive(Debug)]
pub(crate) struct BlockTable {
    /// Ids are sequential and internal, so the cheap index hasher serves (a release, one lookup
    /// here, happens for every cell that leaves a block).
    blocks: HashMap<BlockId, Block, BuildHasherDefault<IndexHasher>>,
    next_id: BlockId,
    threshold: f64,
    pending: Vec<BlockId>,
    counters: BlockCounters,
}

impl BlockTable {
    /// `threshold` is the live fraction below which a block is compacted (validated by the unit).
    pub fn new(threshold: f64) -> Self {
        BlockTable {
            blocks: HashMap::default(),
            next_id: 0,
            threshold,
            pending: Vec::new(),
            counters: BlockCounters::default(),
        }
    }

    /// Registers a block of `total_bytes` whose live members are `members` (index, bytes).
    ///
    /// Returns `None` when there is nothing worth tracking (no bytes pinned or no members): such
    /// cells are treated as owned. A block that starts out sparser than the threshold (an update
    /// that kept only a few slices of its request buffer) is queued for compaction at once.
    pub fn open(
        &mut self,
        field: &str,
        members: Vec<(u32, u64)>,
        total_bytes: u64,
    ) -> Option<BlockId> {
        let live_bytes: u64 = members.iter().map(|&(_, b)| b).sum();
        if total_bytes == 0 || members.is_empty() {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        let block = Block {
            field: field.to_string(),
            live_cells: members.len(),
            members: members.into_iter().map(|(i, _)| i).collect(),
            total_bytes,
            live_bytes,
            compacting: false,
        };
        self.counters.blocks += 1;
        self.counters.retained_bytes += total_bytes;
        self.counters.live_bytes += live_bytes;
        self.blocks.insert(id, block);
        self.queue_if_sparse(id);
        Some(id)
    }

    /// A cell of `nbytes` left block `id` (cleared, overwritten, purged or moved out by
    /// compaction). Drops the block when it has no live cells left; queues it for compaction when
    /// it became sparse.
    pub fn release(&mut self, id: BlockId, nbytes: u64) {
        let Some(block) = self.blocks.get_mut(&id) else {
            tracing::error!(block = id, "released a cell of an unknown block");
            return;
        };
        block.live_cells -= 1;
        block.live_bytes -= nbytes;
        self.counters.live_bytes -= nbytes;
        if block.live_cells == 0 {
            let total_bytes = block.total_bytes;
            debug_assert_eq!(block.live_bytes, 0);
            self.blocks.remove(&id);
            self.counters.blocks -= 1;
            self.counters.retained_bytes -= total_bytes;
        } else if Self::becomes_sparse(self.threshold, block) {
            self.pending.push(id);
        }
    }

    fn queue_if_sparse(&mut self, id: BlockId) {
        let Some(block) = self.blocks.get_mut(&id) else {
            return;
        };
        if Self::becomes_sparse(self.threshold, block) {
            self.pending.push(id);
        }
    }

    /// Marks `block` as compacting and returns true when it just became sparse and must be
    /// queued. Takes the block itself so a release needs one map lookup, not two.
    fn becomes_sparse(threshold: f64, block: &mut Block) -> bool {
        // `live < threshold * total`; a threshold of 0 never compacts, 1 compacts on any loss.
        let sparse = (block.live_bytes as f64) < threshold * block.total_bytes as f64;
        if sparse && !block.compacting && block.live_cells > 0 {
            block.compacting = true;
            return true;
        }
        false
    }

    /// True when some block waits for compaction.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Takes the next block to compact with what must be copied out of it. Blocks that emptied
    /// while queued are skipped.
    pub fn next_job(&mut self) -> Option<(BlockId, CompactionJob)> {
        while let Some(id) = self.pending.pop() {
            if let Some(block) = self.blocks.get(&id) {
                let job = CompactionJob {
                    field: block.field.clone(),
                    members: block.members.clone(),
                };
                return Some((id, job));
            }
        }
        None
    }

    /// Records a finished compaction that copied `copied_bytes` out of a block (the copied cells
    /// were released one by one, which dropped the block).
    pub fn record_compaction(&mut self, copied_bytes: u64) {
        self.counters.compactions += 1;
        self.counters.compacted_bytes += copied_bytes;
    }

    /// Whether block `id` still exists (tests and invariant checks).
    pub fn contains(&self, id: BlockId) -> bool {
        self.blocks.contains_key(&id)
    }

    pub fn counters(&self) -> BlockCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_blocks_are_queued_once_and_empty_ones_dropped() {
        let mut t = BlockTable::new(0.5);
        let id = t
            .open("x", (0..4).map(|i| (i, 10)).collect(), 40)
            .expect("tracked");
        assert_eq!(t.counters().retained_bytes, 40);
        t.release(id, 10);
        assert!(!t.has_pending(), "75% live is above the threshold");
        t.release(id, 10);
        assert!(!t.has_pending(), "50% live is not below the threshold");
        t.release(id, 10);
        assert!(t.has_pending(), "25% live is below the threshold");
        let (jid, job) = t.next_job().expect("queued");
        assert_eq!((jid, job.field.as_str(), job.members.len()), (id, "x", 4));
        assert!(t.next_job().is_none(), "queued once");
        t.release(id, 10);
        assert!(!t.contains(id), "no live cells: dropped");
        assert_eq!(t.counters(), BlockCounters::default());
    }

    #[test]
    fn nothing_to_track_and_born_sparse() {
        let mut t = BlockTable::new(0.5);
        assert!(t.open("x", vec![], 10).is_none());
        assert!(t.open("x", vec![(1, 0)], 0).is_none());
        let id = t.open("x", vec![(1, 1)], 10).expect("tracked");
        assert_eq!(t.next_job().map(|(j, _)| j), Some(id));
        let mut never = BlockTable::new(0.0);
        let id = never.open("x", vec![(1, 1), (2, 1)], 2).unwrap();
        never.release(id, 1);
        assert!(!never.has_pending(), "threshold 0 disables compaction");
    }
}
