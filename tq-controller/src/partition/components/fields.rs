//! The field table: each field's column number, schema (dtype, kind, shapes) and which slots
//! hold a cell of it, plus the cells under a field-level clear.
//!
//! Invariants: a field keeps its column number for the partition's lifetime (`field_ids` is
//! the inverse of the fields' names, checked on a restore by [`FieldTable::check`]); a field's
//! `members` is the number of its `produced` bits; a field with no members has no schema; a
//! ragged field whose members agree again is uniform.

use crate::bitmap::Bitmap;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use tq_core::{DType, FieldMeta, FieldName, Result};

/// The field table's parts in a record: fields, index by name, cells under a field clear.
pub(in crate::partition) type FieldParts<'a> = (
    &'a Vec<FieldState>,
    &'a HashMap<FieldName, usize>,
    &'a HashSet<(u32, usize)>,
);

/// The fields of one partition.
#[derive(Debug, Default)]
pub(in crate::partition) struct FieldTable {
    fields: Vec<FieldState>,
    field_ids: HashMap<FieldName, usize>,
    /// Cells under a field-level clear: (slot, field id).
    clearing_cells: HashSet<(u32, usize)>,
}

impl FieldTable {
    /// The table's parts as a record holds them (see `record.rs`).
    pub fn parts(&self) -> FieldParts<'_> {
        (&self.fields, &self.field_ids, &self.clearing_cells)
    }

    pub fn from_parts(
        fields: Vec<FieldState>,
        field_ids: HashMap<FieldName, usize>,
        clearing_cells: HashSet<(u32, usize)>,
    ) -> Self {
        FieldTable {
            fields,
            field_ids,
            clearing_cells,
        }
    }

    /// What is wrong with a restored table, if anything.
    pub fn check(&self) -> Option<String> {
        let consistent = self.field_ids.len() == self.fields.len()
            && self
                .field_ids
                .iter()
                .all(|(name, &f)| self.fields.get(f).is_some_and(|s| &s.name == name));
        (!consistent).then(|| "its field index does not match its fields".into())
    }

    /// The column of `name`, if registered.
    pub fn id(&self, name: &str) -> Option<usize> {
        self.field_ids.get(name).copied()
    }

    /// The column of `name`, registering the field (without schema or members) if new.
    pub fn register(&mut self, name: &str) -> usize {
        if let Some(&f) = self.field_ids.get(name) {
            return f;
        }
        self.fields.push(FieldState::new(name.to_string()));
        self.field_ids
            .insert(name.to_string(), self.fields.len() - 1);
        self.fields.len() - 1
    }

    /// Columns of those of `names` that are registered.
    pub fn ids_of(&self, names: &[FieldName]) -> Vec<usize> {
        names.iter().filter_map(|n| self.id(n)).collect()
    }

    /// Columns of `names`, or `None` if any is not registered.
    pub fn known(&self, names: &[FieldName]) -> Option<Vec<usize>> {
        names.iter().map(|n| self.id(n)).collect()
    }

    /// Number of registered fields (every column is `0..len`).
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    pub fn get(&self, f: usize) -> &FieldState {
        &self.fields[f]
    }

    pub fn get_mut(&mut self, f: usize) -> &mut FieldState {
        &mut self.fields[f]
    }

    pub fn name(&self, f: usize) -> &FieldName {
        &self.fields[f].name
    }

    /// Whether field `f` holds a produced cell in `slot`.
    pub fn produced(&self, f: usize, slot: u32) -> bool {
        self.fields[f].produced.get(slot as usize)
    }

    /// Fields that currently have at least one member, in column order.
    pub fn populated(&self) -> impl Iterator<Item = (usize, &FieldState)> {
        self.fields
            .iter()
            .enumerate()
            .filter(|(_, f)| f.members > 0)
    }

    /// Removes `slot` from every field and every field-level clear (its sample is released).
    pub fn forget_slot(&mut self, slot: u32) {
        for f in &mut self.fields {
            f.remove(slot);
        }
        self.clearing_cells.retain(|&(s, _)| s != slot);
    }

    /// Brings every field back to its normal form after removals.
    pub fn normalize_all(&mut self) {
        self.fields.iter_mut().for_each(FieldState::normalize);
    }

    /// Whether any cell is under a field-level clear.
    pub fn any_clearing_cell(&self) -> bool {
        !self.clearing_cells.is_empty()
    }

    pub fn is_clearing_cell(&self, slot: u32, f: usize) -> bool {
        self.clearing_cells.contains(&(slot, f))
    }

    /// Blocks writes to cell (`slot`, `f`) until [`FieldTable::end_clearing_cell`].
    pub fn begin_clearing_cell(&mut self, slot: u32, f: usize) {
        self.clearing_cells.insert((slot, f));
    }

    /// Unblocks cell (`slot`, `f`); whether it was being cleared.
    pub fn end_clearing_cell(&mut self, slot: u32, f: usize) -> bool {
        self.clearing_cells.remove(&(slot, f))
    }
}

/// Per-sample shapes of a tensor field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Shapes {
    /// No member yet (or an object field).
    Unknown,
    /// Every member has this shape.
    Uniform(Vec<usize>),
    /// Members differ (ragged).
    PerSlot(RaggedShapes),
}

/// Shapes of a ragged field: one per member slot, plus how many members have each shape, so
/// that deciding whether the field is dense again costs O(1) instead of a scan of the members.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
struct RaggedShapes {
    by_slot: HashMap<u32, Vec<usize>>,
    counts: HashMap<Vec<usize>, usize>,
}

impl RaggedShapes {
    fn insert(&mut self, slot: u32, shape: Vec<usize>) {
        self.remove(slot);
        *self.counts.entry(shape.clone()).or_default() += 1;
        self.by_slot.insert(slot, shape);
    }

    fn remove(&mut self, slot: u32) {
        if let Some(old) = self.by_slot.remove(&slot) {
            if let Some(c) = self.counts.get_mut(&old) {
                *c -= 1;
                if *c == 0 {
                    self.counts.remove(&old);
                }
            }
        }
    }

    /// The one shape every member has, if there is exactly one.
    fn single_shape(&self) -> Option<&Vec<usize>> {
        match self.counts.len() {
            1 => self.counts.keys().next(),
            _ => None,
        }
    }
}

/// The schema and membership of one field in one partition. Fields keep their column number for
/// the partition's lifetime; a field with no members forgets its dtype and shapes.
#[derive(Debug, Serialize, Deserialize)]
pub(in crate::partition) struct FieldState {
    name: FieldName,
    produced: Bitmap,
    members: usize,
    dtype: Option<DType>,
    is_object: bool,
    shapes: Shapes,
}

impl FieldState {
    fn new(name: FieldName) -> Self {
        FieldState {
            name,
            produced: Bitmap::default(),
            members: 0,
            dtype: None,
            is_object: false,
            shapes: Shapes::Unknown,
        }
    }

    /// Which of the 64 slots of word `w` hold a cell of this field.
    pub fn produced_word(&self, w: usize) -> u64 {
        self.produced.word(w)
    }

    pub fn check(&self, incoming: &FieldMeta) -> Result<()> {
        if self.members == 0 {
            return Ok(());
        }
        let current = if self.is_object {
            FieldMeta::object()
        } else {
            FieldMeta::dense(self.dtype.unwrap_or(DType::U8), vec![])
        };
        current.check_compatible(&self.name, incoming)
    }

    pub fn add(&mut self, slots: &[u32], schema: &FieldMeta) {
        if self.members == 0 {
            self.dtype = schema.dtype();
            self.is_object = !schema.is_tensor();
            self.shapes = Shapes::Unknown;
        }
        for (row, &slot) in slots.iter().enumerate() {
            if !self.is_object {
                let shape = schema.row_shape(row).unwrap_or(&[]);
                match &mut self.shapes {
                    Shapes::Unknown => self.shapes = Shapes::Uniform(shape.to_vec()),
                    Shapes::Uniform(u) if u.as_slice() == shape => {}
                    Shapes::Uniform(u) => {
                        // Promotion to ragged: every existing member keeps the old shape.
                        let old = std::mem::take(u);
                        let mut ragged = RaggedShapes::default();
                        for s in self.produced.ones() {
                            ragged.insert(s as u32, old.clone());
                        }
                        ragged.insert(slot, shape.to_vec());
                        self.shapes = Shapes::PerSlot(ragged);
                    }
                    Shapes::PerSlot(ragged) => ragged.insert(slot, shape.to_vec()),
                }
            }
            if !self.produced.get(slot as usize) {
                self.produced.set(slot as usize, true);
                self.members += 1;
            }
        }
        // Overwrites may have given every member the same shape again.
        self.normalize();
    }

    /// Removes one cell; returns whether it was present. Call `normalize` after a batch.
    pub fn remove(&mut self, slot: u32) -> bool {
        if !self.produced.get(slot as usize) {
            return false;
        }
        self.produced.set(slot as usize, false);
        self.members -= 1;
        if let Shapes::PerSlot(ragged) = &mut self.shapes {
            ragged.remove(slot);
        }
        true
    }

    /// Forgets the schema of an empty field; demotes a ragged field whose members agree. O(1).
    pub fn normalize(&mut self) {
        if self.members == 0 {
            self.dtype = None;
            self.is_object = false;
            self.shapes = Shapes::Unknown;
            self.produced.clear_all();
            return;
        }
        if let Shapes::PerSlot(ragged) = &self.shapes {
            if let Some(shape) = ragged.single_shape() {
                self.shapes = Shapes::Uniform(shape.clone());
            }
        }
    }

    /// The schema of this field over `slots` (rows without the cell get an empty shape).
    pub fn schema(&self, slots: &[u32]) -> FieldMeta {
        if self.is_object {
            return FieldMeta::object();
        }
        let dtype = self.dtype.unwrap_or(DType::U8);
        match &self.shapes {
            Shapes::Unknown => FieldMeta::dense(dtype, vec![]),
            Shapes::Uniform(s) => FieldMeta::dense(dtype, s.clone()),
            Shapes::PerSlot(ragged) => FieldMeta::from_shapes(
                dtype,
                slots
                    .iter()
                    .map(|s| ragged.by_slot.get(s).cloned().unwrap_or_default())
                    .collect(),
            ),
        }
    }
}
