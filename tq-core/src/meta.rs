//! Sample identities and batch metadata.

use crate::{Batch, Column, DType, Error, FieldKind, FieldMeta, FieldName, Result};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

mod combine;
mod wire;
pub use wire::snapshot_layout;

/// Identity of one sample: a storage index plus the generation of that index.
///
/// The controller reuses indexes after a clear and bumps the generation on every reuse. Storage
/// operations carry the generation, so a stale writer, reader or clear can never touch the newer
/// sample that took its index over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SampleId {
    pub index: u32,
    pub generation: u32,
}

impl SampleId {
    pub const fn new(index: u32, generation: u32) -> Self {
        SampleId { index, generation }
    }
}

impl fmt::Display for SampleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@g{}", self.index, self.generation)
    }
}

/// A small tag value attached to a sample (its "custom meta").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum TagValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

impl TagValue {
    /// The value as a number, when it is one.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            TagValue::Int(i) => Some(*i as f64),
            TagValue::Float(f) => Some(*f),
            _ => None,
        }
    }
}

impl From<i64> for TagValue {
    fn from(v: i64) -> Self {
        TagValue::Int(v)
    }
}
impl From<f64> for TagValue {
    fn from(v: f64) -> Self {
        TagValue::Float(v)
    }
}
impl From<bool> for TagValue {
    fn from(v: bool) -> Self {
        TagValue::Bool(v)
    }
}
impl From<&str> for TagValue {
    fn from(v: &str) -> Self {
        TagValue::Str(v.to_string())
    }
}
impl From<String> for TagValue {
    fn from(v: String) -> Self {
        TagValue::Str(v)
    }
}

/// Per-sample tags: a small ordered map.
pub type Tags = BTreeMap<String, TagValue>;

/// Opaque per-cell data a storage backend needs to find a cell again (e.g. which store holds it).
pub type BackendMeta = BTreeMap<FieldName, Bytes>;

/// What the controller hands a client for a batch of samples of one partition.
///
/// Every per-row vector has one entry per sample, in sample order; constructors and operations
/// keep that invariant.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchMeta {
    partition: String,
    samples: Vec<SampleId>,
    fields: BTreeMap<FieldName, FieldMeta>,
    production: Vec<bool>,
    tags: Vec<Tags>,
    backend_meta: Vec<BackendMeta>,
    /// The lease under which a fetch in acknowledged mode handed these samples out.
    lease: Option<LeaseId>,
    /// Per row, the fields whose value is a shared payload: read from that (public) sample.
    links: Vec<Links>,
}

/// Fields of one sample that read another sample's payload (`kv_link`): field → source sample.
pub type Links = BTreeMap<FieldName, SampleId>;

/// Identifies one acknowledged-mode hand-out: acknowledging with it consumes the samples; an
/// acknowledgement with an expired (re-leased) lease changes nothing.
pub type LeaseId = u64;

/// Every part of a [`BatchMeta`], for a builder that has all of them at once (the controller,
/// a decoder): [`BatchMeta::from_parts`] checks them together and allocates nothing more.
#[derive(Debug, Clone, Default)]
pub struct BatchMetaParts {
    pub partition: String,
    pub samples: Vec<SampleId>,
    pub fields: BTreeMap<FieldName, FieldMeta>,
    /// One entry per sample.
    pub production: Vec<bool>,
    /// One map per sample.
    pub tags: Vec<Tags>,
    /// One map per sample.
    pub backend_meta: Vec<BackendMeta>,
    pub lease: Option<LeaseId>,
    /// One map per sample.
    pub links: Vec<Links>,
}

fn check_len(what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::invalid(format!(
            "{what} has {got} entries for {want} samples"
        )));
    }
    Ok(())
}

impl BatchMeta {
    /// Metadata for `samples` of `partition`: no fields, nothing produced, no tags.
    pub fn new(partition: impl Into<String>, samples: Vec<SampleId>) -> Self {
        let n = samples.len();
        BatchMeta {
            partition: partition.into(),
            samples,
            fields: BTreeMap::new(),
            production: vec![false; n],
            tags: vec![Tags::new(); n],
            backend_meta: vec![BackendMeta::new(); n],
            lease: None,
            links: vec![Links::new(); n],
        }
    }

    /// Metadata from all its parts at once; `Invalid` when a per-row vector's length is not
    /// the number of samples, or a ragged field's shapes do not count the rows.
    pub fn from_parts(parts: BatchMetaParts) -> Result<Self> {
        let n = parts.samples.len();
        for (name, s) in &parts.fields {
            s.check_rows(name, n)?;
        }
        check_len("production status", parts.production.len(), n)?;
        check_len("tags", parts.tags.len(), n)?;
        check_len("backend meta", parts.backend_meta.len(), n)?;
        check_len("links", parts.links.len(), n)?;
        Ok(BatchMeta {
            partition: parts.partition,
            samples: parts.samples,
            fields: parts.fields,
            production: parts.production,
            tags: parts.tags,
            backend_meta: parts.backend_meta,
            lease: parts.lease,
            links: parts.links,
        })
    }

    /// An empty batch of `partition` (zero samples).
    pub fn empty(partition: impl Into<String>) -> Self {
        BatchMeta::new(partition, Vec::new())
    }

    /// Sets the schemas of the fields; ragged schemas must have one shape per sample.
    pub fn with_fields(mut self, fields: BTreeMap<FieldName, FieldMeta>) -> Result<Self> {
        for (name, s) in &fields {
            s.check_rows(name, self.samples.len())?;
        }
        self.fields = fields;
        Ok(self)
    }

    pub fn with_production(mut self, production: Vec<bool>) -> Result<Self> {
        check_len("production status", production.len(), self.samples.len())?;
        self.production = production;
        Ok(self)
    }

    pub fn with_tags(mut self, tags: Vec<Tags>) -> Result<Self> {
        check_len("tags", tags.len(), self.samples.len())?;
        self.tags = tags;
        Ok(self)
    }

    pub fn with_backend_meta(mut self, backend_meta: Vec<BackendMeta>) -> Result<Self> {
        check_len("backend meta", backend_meta.len(), self.samples.len())?;
        self.backend_meta = backend_meta;
        Ok(self)
    }

    pub fn partition(&self) -> &str {
        &self.partition
    }
    pub fn samples(&self) -> &[SampleId] {
        &self.samples
    }
    pub fn len(&self) -> usize {
        self.samples.len()
    }
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
    pub fn fields(&self) -> &BTreeMap<FieldName, FieldMeta> {
        &self.fields
    }
    /// Field names in sorted order.
    pub fn field_names(&self) -> impl Iterator<Item = &str> {
        self.fields.keys().map(String::as_str)
    }
    pub fn production(&self) -> &[bool] {
        &self.production
    }
    /// True when the batch is non-empty and every sample is produced for the batch's fields.
    pub fn is_ready(&self) -> bool {
        !self.samples.is_empty() && self.production.iter().all(|&p| p)
    }
    pub fn tags(&self) -> &[Tags] {
        &self.tags
    }
    /// Mutable tags, e.g. to set tags before a put (they travel with its production notice).
    pub fn tags_mut(&mut self) -> &mut [Tags] {
        &mut self.tags
    }
    /// Sets the lease these samples were handed out under (acknowledged mode).
    pub fn with_lease(mut self, lease: Option<LeaseId>) -> Self {
        self.lease = lease;
        self
    }

    /// The lease of an acknowledged-mode fetch; `None` for everything else.
    pub fn lease(&self) -> Option<LeaseId> {
        self.lease
    }

    pub fn backend_meta(&self) -> &[BackendMeta] {
        &self.backend_meta
    }

    /// Sets the per-row links (field → source sample); one map per sample.
    pub fn with_links(mut self, links: Vec<Links>) -> Result<Self> {
        check_len("links", links.len(), self.samples.len())?;
        self.links = links;
        Ok(self)
    }

    /// Per row, the fields that read a shared payload, and from which sample.
    pub fn links(&self) -> &[Links] {
        &self.links
    }

    /// True when some field of some row is a link.
    pub fn has_links(&self) -> bool {
        self.links.iter().any(|l| !l.is_empty())
    }

    /// Records that `schemas` were written for every sample: adds or replaces those fields,
    /// marks every sample produced, and merges per-row backend meta when given.
    pub fn add_fields(
        &mut self,
        schemas: BTreeMap<FieldName, FieldMeta>,
        backend_meta: Option<Vec<BackendMeta>>,
    ) -> Result<()> {
        self.check_new_fields(&schemas, backend_meta.as_deref())?;
        for row in &mut self.links {
            row.retain(|f, _| !schemas.contains_key(f));
        }
        self.fields.extend(schemas);
        self.production.iter_mut().for_each(|p| *p = true);
        if let Some(bm) = backend_meta {
            for (mine, theirs) in self.backend_meta.iter_mut().zip(bm) {
                mine.extend(theirs);
            }
        }
        Ok(())
    }

    /// The checks of [`BatchMeta::add_fields`] alone, for callers that only need to know whether
    /// the fields would fit (so they need not clone this meta to find out).
    pub fn check_new_fields(
        &self,
        schemas: &BTreeMap<FieldName, FieldMeta>,
        backend_meta: Option<&[BackendMeta]>,
    ) -> Result<()> {
        for (name, s) in schemas {
            s.check_rows(name, self.samples.len())?;
        }
        if let Some(bm) = backend_meta {
            check_len("backend meta", bm.len(), self.samples.len())?;
        }
        Ok(())
    }

    /// Checks that `batch`, read for this metadata, holds what it describes: one row per sample
    /// and, for every field, the kind, dtype and per-row shapes of its schema. A mismatch is
    /// `Corrupted` naming the partition, field and row: storage returned something other than
    /// what was published, and that must never reach a caller as data.
    pub fn check_batch(&self, batch: &Batch) -> Result<()> {
        let bad = |field: &str, why: String| {
            Error::corrupted(format!(
                "partition `{}`: field `{field}` read back {why}",
                self.partition
            ))
        };
        if batch.len() != self.len() {
            return Err(Error::corrupted(format!(
                "partition `{}`: read returned {} rows for {} samples",
                self.partition,
                batch.len(),
                self.len()
            )));
        }
        for (name, schema) in &self.fields {
            let Some(column) = batch.column(name) else {
                return Err(bad(name, "missing from the read".into()));
            };
            let check_tensor = |row: usize, t: &crate::Tensor, shape: &[usize]| {
                if Some(t.dtype()) != schema.dtype() {
                    return Err(bad(
                        name,
                        format!(
                            "as {} where the metadata says {}",
                            t.dtype().name(),
                            schema.dtype().map_or("an object", DType::name)
                        ),
                    ));
                }
                if schema.row_shape(row) != Some(shape) {
                    return Err(bad(
                        name,
                        format!(
                            "with shape {shape:?} at row {row} (sample {}) where the metadata says {:?}",
                            self.samples[row],
                            schema.row_shape(row)
                        ),
                    ));
                }
                Ok(())
            };
            match (schema.kind(), column) {
                (FieldKind::Object, Column::Objects(_)) => {}
                (FieldKind::Object, _) => {
                    return Err(bad(
                        name,
                        "as tensors where the metadata says objects".into(),
                    ))
                }
                (_, Column::Objects(_)) => {
                    return Err(bad(
                        name,
                        "as objects where the metadata says tensors".into(),
                    ))
                }
                (FieldKind::Dense, Column::Dense(t)) => check_tensor(0, t, &t.shape()[1..])?,
                (_, Column::Dense(t)) => {
                    for row in 0..self.len() {
                        check_tensor(row, t, &t.shape()[1..])?;
                    }
                }
                (_, Column::Ragged(rows)) => {
                    for (row, t) in rows.iter().enumerate() {
                        check_tensor(row, t, t.shape())?;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn meta(n: u32) -> BatchMeta {
        let samples = (0..n).map(|i| SampleId::new(i, 0)).collect();
        let mut m = BatchMeta::new("p", samples);
        for (i, t) in m.tags_mut().iter_mut().enumerate() {
            t.insert("i".into(), TagValue::Int(i as i64));
        }
        m
    }

    #[test]
    fn chunk_sizes_remainder_first() {
        let m = meta(10);
        let sizes: Vec<usize> = m.chunk(3).unwrap().iter().map(BatchMeta::len).collect();
        assert_eq!(sizes, vec![4, 3, 3]);
        let c = m.chunk(3).unwrap();
        assert_eq!(c[1].tags()[0]["i"], TagValue::Int(4));
        let sizes: Vec<usize> = meta(2)
            .chunk(3)
            .unwrap()
            .iter()
            .map(BatchMeta::len)
            .collect();
        assert_eq!(sizes, vec![1, 1, 0]);
        assert!(m.chunk(0).is_err());
    }

    #[test]
    fn new_meta_is_not_ready_and_lengths_are_checked() {
        let m = meta(2);
        assert!(!m.is_ready());
        assert!(!BatchMeta::empty("p").is_ready());
        assert!(m.clone().with_production(vec![true]).is_err());
        let m = m.with_production(vec![true, true]).unwrap();
        assert!(m.is_ready());
    }

    #[test]
    fn union_ands_production_and_other_wins() {
        let mut a = meta(2)
            .with_fields([("x".to_string(), FieldMeta::dense(DType::F32, vec![1]))].into())
            .unwrap();
        a = a.with_production(vec![true, false]).unwrap();
        let mut b = meta(2)
            .with_fields([("x".to_string(), FieldMeta::dense(DType::F32, vec![2]))].into())
            .unwrap()
            .with_production(vec![true, true])
            .unwrap();
        b.tags_mut()[0].insert("j".into(), TagValue::Int(7));
        let u = a.union(&b).unwrap();
        assert_eq!(u.production(), &[true, false]);
        assert_eq!(u.fields()["x"].sample_shape(), Some(&[2][..]));
        assert_eq!(u.tags()[0].len(), 2);
        let c = BatchMeta::new("p", vec![SampleId::new(9, 0), SampleId::new(1, 0)]);
        assert!(a.union(&c).is_err());
        assert_eq!(a.union(&BatchMeta::empty("p")).unwrap(), a);
    }

    #[test]
    fn concat_checks_fields_and_promotes_shapes() {
        let a = meta(1)
            .with_fields([("x".to_string(), FieldMeta::dense(DType::F32, vec![1]))].into())
            .unwrap();
        let b = meta(2)
            .with_fields([("x".to_string(), FieldMeta::dense(DType::F32, vec![3]))].into())
            .unwrap();
        let c = BatchMeta::concat(&[a.clone(), b]).unwrap();
        assert_eq!(c.len(), 3);
        assert_eq!(c.fields()["x"].kind(), crate::FieldKind::Ragged);
        let d = meta(1)
            .with_fields([("y".to_string(), FieldMeta::object())].into())
            .unwrap();
        assert!(BatchMeta::concat(&[a.clone(), d]).is_err());
        let e = meta(1)
            .with_fields([("x".to_string(), FieldMeta::dense(DType::I64, vec![1]))].into())
            .unwrap();
        assert!(BatchMeta::concat(&[a, e])
            .unwrap_err()
            .message()
            .contains("dtype"));
    }

    #[test]
    fn select_is_isolated_and_checked() {
        let m = meta(3)
            .with_fields([("x".to_string(), FieldMeta::object())].into())
            .unwrap();
        let mut s = m.select_samples(&[2, 0]).unwrap();
        assert_eq!(s.samples(), &[SampleId::new(2, 0), SampleId::new(0, 0)]);
        s.tags_mut()[0].clear();
        assert_eq!(m.tags()[2].len(), 1);
        assert!(m.select_samples(&[3]).is_err());
        assert!(m.select_fields(&["nope"]).is_err());
        assert_eq!(m.select_fields(&["x"]).unwrap().fields().len(), 1);
    }
}
