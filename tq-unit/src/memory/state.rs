//! The cell tables of a [`super::MemoryUnit`] (what its one lock guards) and the bookkeeping
//! that keeps their counts right as cells come and go.

use crate::block::{BlockId, BlockTable};
use crate::index::{reset_emptied, IndexMap};
use std::collections::HashMap;
use tq_core::{FieldName, SampleId, Value};

#[derive(Debug)]
pub(super) struct Cell {
    pub(super) generation: u32,
    pub(super) value: Value,
    /// The shared allocation this value is a slice of, if tracked.
    pub(super) block: Option<BlockId>,
    /// Identifies the write that produced this value (unique per request); lets an update
    /// detect that a cell changed while its merge ran outside the lock.
    pub(super) stamp: u64,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Row {
    /// Every cell of the row has this generation.
    pub(super) generation: u32,
    pub(super) cells: usize,
}

/// Everything a [`MemoryUnit`] holds, behind its one lock.
#[derive(Debug)]
pub(super) struct State {
    /// field → sample index → cell.
    pub(super) fields: HashMap<FieldName, IndexMap<Cell>>,
    /// Emptied field maps kept for the next new field (see [`SPARE_FIELD_MAPS`]).
    pub(super) spare_maps: Vec<IndexMap<Cell>>,
    /// sample index → generation and number of cells. An index is present iff it has cells.
    pub(super) rows: IndexMap<Row>,
    pub(super) blocks: BlockTable,
    pub(super) cells: usize,
    pub(super) live_bytes: u64,
    pub(super) next_stamp: u64,
}

/// How many emptied field maps a unit keeps for reuse. A batch's field map is large (a
/// thousand cells make a table of 100+ KiB); dropping it on every clear and allocating it again
/// on the next put makes each put fault fresh pages in whenever malloc serves tables of that size
/// with mmap (its default below an adaptive threshold), so the cost of a put would depend on
/// the process's allocation history. Keeping a few emptied maps makes it independent of that.
pub(super) const SPARE_FIELD_MAPS: usize = 32;

/// Emptied maps with room for more cells than this are freed, not kept: a one-off huge batch
/// should not pin its tables.
pub(super) const SPARE_MAP_MAX_CELLS: usize = 16 << 10;

/// Keeps an emptied field map for reuse, unless enough are kept already or it is too large.
pub(super) fn keep_spare(spare_maps: &mut Vec<IndexMap<Cell>>, mut map: IndexMap<Cell>) {
    debug_assert!(map.is_empty());
    if spare_maps.len() < SPARE_FIELD_MAPS && map.capacity() <= SPARE_MAP_MAX_CELLS {
        reset_emptied(
            &mut map,
            Cell {
                generation: 0,
                value: Value::Object(bytes::Bytes::new()),
                block: None,
                stamp: 0,
            },
        );
        spare_maps.push(map);
    }
}

/// Undoes the accounting of a cell that left the unit (or was replaced).
fn forget(blocks: &mut BlockTable, live_bytes: &mut u64, cell: &Cell) {
    let n = cell.value.nbytes() as u64;
    *live_bytes -= n;
    if let Some(b) = cell.block {
        blocks.release(b, n);
    }
}

impl State {
    pub(super) fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    /// Stores one field's cells, replacing same-generation cells. The field's map is looked up
    /// once for all cells (not per cell) and, when new, sized for them up front.
    pub(super) fn insert_field(
        &mut self,
        field: &str,
        new_cells: impl ExactSizeIterator<Item = (SampleId, Cell)>,
    ) {
        let State {
            fields,
            spare_maps,
            rows,
            blocks,
            cells,
            live_bytes,
            ..
        } = self;
        let map = match fields.get_mut(field) {
            Some(m) => m,
            None => fields.entry(field.to_string()).or_insert_with(|| {
                let wanted = new_cells.len();
                match spare_maps.iter().position(|m| m.capacity() >= wanted) {
                    Some(i) => spare_maps.swap_remove(i),
                    None => IndexMap::with_capacity_and_hasher(wanted, Default::default()),
                }
            }),
        };
        for (sample, cell) in new_cells {
            *live_bytes += cell.value.nbytes() as u64;
            match map.insert(sample.index, cell) {
                Some(old) => forget(blocks, live_bytes, &old),
                None => {
                    *cells += 1;
                    let row = rows.entry(sample.index).or_insert(Row {
                        generation: sample.generation,
                        cells: 0,
                    });
                    debug_assert_eq!(row.generation, sample.generation, "older row not purged");
                    row.cells += 1;
                }
            }
        }
    }

    /// Removes one cell, if stored, and returns its value (for the caller to free).
    pub(super) fn remove(&mut self, field: &str, index: u32) -> Option<Value> {
        let State {
            fields,
            spare_maps,
            rows,
            blocks,
            cells,
            live_bytes,
            ..
        } = self;
        let map = fields.get_mut(field)?;
        let cell = map.remove(&index)?;
        if map.is_empty() {
            if let Some(emptied) = fields.remove(field) {
                keep_spare(spare_maps, emptied);
            }
        }
        forget(blocks, live_bytes, &cell);
        *cells -= 1;
        if let Some(row) = rows.get_mut(&index) {
            row.cells -= 1;
            if row.cells == 0 {
                rows.remove(&index);
            }
        }
        Some(cell.value)
    }

    /// Removes every cell of `indexes`, whatever the field, adding their values to `freed`
    /// (for the caller to free once the lock is released).
    ///
    /// Field by field: each field's table is walked for all the indexes before the next one,
    /// so one table at a time is in cache. Sample by sample, every cell removed sat in another
    /// table than the one before; field by field cut an embedded clear of 1024 samples × 28
    /// fields by about a fifth (docs/benchmarks.md, "Clears").
    pub(super) fn purge(&mut self, indexes: &[u32], freed: &mut Vec<Value>) {
        let State {
            fields,
            spare_maps,
            rows,
            blocks,
            cells,
            live_bytes,
            ..
        } = self;
        freed.reserve(indexes.len() * fields.len());
        let mut emptied = false;
        for map in fields.values_mut() {
            for index in indexes {
                if let Some(cell) = map.remove(index) {
                    forget(blocks, live_bytes, &cell);
                    *cells -= 1;
                    freed.push(cell.value);
                }
            }
            emptied |= map.is_empty();
        }
        if emptied {
            let names: Vec<FieldName> = fields
                .iter()
                .filter(|(_, map)| map.is_empty())
                .map(|(field, _)| field.clone())
                .collect();
            for field in names {
                if let Some(map) = fields.remove(&field) {
                    keep_spare(spare_maps, map);
                }
            }
        }
        for index in indexes {
            rows.remove(index);
        }
        if rows.is_empty() {
            reset_emptied(
                rows,
                Row {
                    generation: 0,
                    cells: 0,
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        State {
            fields: HashMap::new(),
            spare_maps: Vec::new(),
            rows: IndexMap::default(),
            blocks: BlockTable::new(0.5),
            cells: 0,
            live_bytes: 0,
            next_stamp: 0,
        }
    }

    /// A purge of many indexes removes their cells from every field and keeps the counts.
    #[test]
    fn a_purge_of_many_indexes_removes_every_field_and_keeps_the_counts() {
        let mut st = state();
        st.insert_field("a", cells(10));
        st.insert_field("b", cells(10));
        let mut freed = Vec::new();
        st.purge(&[1, 3, 3, 42], &mut freed);
        assert_eq!(freed.len(), 4, "two cells of each of the two indexes");
        assert_eq!(st.cells, 16);
        assert_eq!(st.live_bytes, 16 * 8);
        assert_eq!(st.rows.len(), 8);
        assert!(!st.fields["a"].contains_key(&1) && !st.fields["b"].contains_key(&3));
        assert!(st.fields["a"].contains_key(&2));
        // The rest of every table, and an index never stored.
        let rest: Vec<u32> = (0..10)
            .filter(|i| ![1, 3].contains(i))
            .chain([77])
            .collect();
        st.purge(&rest, &mut freed);
        assert_eq!(freed.len(), 20);
        assert!(st.fields.is_empty() && st.rows.is_empty());
        assert_eq!((st.cells, st.live_bytes), (0, 0));
        assert_eq!(st.spare_maps.len(), 2, "both emptied tables are kept");
    }

    fn cells(n: u32) -> impl ExactSizeIterator<Item = (SampleId, Cell)> {
        (0..n).map(|index| {
            let sample = SampleId {
                index,
                generation: 0,
            };
            let value = Value::Object(bytes::Bytes::from(vec![index as u8; 8]));
            let cell = Cell {
                generation: 0,
                value,
                block: None,
                stamp: 0,
            };
            (sample, cell)
        })
    }

    #[test]
    fn an_emptied_field_map_is_kept_and_reused_by_the_next_new_field() {
        let mut st = state();
        st.insert_field("a", cells(1000));
        let capacity = st.fields["a"].capacity();
        for index in 0..1000 {
            st.remove("a", index);
        }
        assert!(st.fields.is_empty() && st.cells == 0 && st.live_bytes == 0);
        assert_eq!(st.spare_maps.len(), 1);
        st.insert_field("b", cells(1000));
        assert!(st.spare_maps.is_empty(), "the kept map was taken");
        assert_eq!(st.fields["b"].capacity(), capacity);
        assert_eq!(st.cells, 1000);
        // Purging every index empties the field map the same way.
        for index in 0..1000 {
            st.purge(&[index], &mut Vec::new());
        }
        assert!(st.fields.is_empty() && st.rows.is_empty());
        assert_eq!(st.spare_maps.len(), 1);
    }

    #[test]
    fn kept_maps_are_bounded_in_number_and_size() {
        let mut st = state();
        let huge = IndexMap::with_capacity_and_hasher(SPARE_MAP_MAX_CELLS * 2, Default::default());
        keep_spare(&mut st.spare_maps, huge);
        assert!(st.spare_maps.is_empty(), "a huge map is freed");
        for _ in 0..SPARE_FIELD_MAPS + 5 {
            keep_spare(&mut st.spare_maps, IndexMap::default());
        }
        assert_eq!(st.spare_maps.len(), SPARE_FIELD_MAPS);
    }
}
