//! How a [`BatchMeta`] is encoded (postcard between peers, JSON in a pickle).
//!
//! Most rows carry no tags, no backend meta and no links, and most batches are produced
//! through and through; sending one empty map per row and one flag per row made decoding a
//! 1024-row lookup answer cost more than the lookup itself. So the per-row maps travel as the
//! rows that have one (`(row, map)` pairs in increasing row order), and production as one flag
//! when every row agrees. The decoder checks what a peer could get wrong (rows out of range,
//! out of order or repeated, a flag vector of another length) before anything is built.
//!
//! Changing this layout changes the controller protocol: it needs a new
//! `tq_net::PROTOCOL_VERSION` (docs/protocol.md, "Versioning").

use super::{BatchMeta, BatchMetaParts, LeaseId, SampleId};
use crate::{Error, FieldMeta, FieldName, Result};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;

/// The production flags on the wire.
#[derive(Serialize)]
enum ProductionRef<'a> {
    /// Every row has this flag (also an empty batch).
    All(bool),
    Each(&'a [bool]),
}

#[derive(Deserialize)]
enum ProductionOwned {
    All(bool),
    Each(Vec<bool>),
}

/// Per-row maps on the wire: the non-empty ones with their row.
struct SparseRows<'a, K, V>(&'a [BTreeMap<K, V>]);

impl<K: Serialize, V: Serialize> Serialize for SparseRows<'_, K, V> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        // postcard needs the length up front.
        let present = self.0.iter().filter(|m| !m.is_empty()).count();
        let mut seq = s.serialize_seq(Some(present))?;
        for (row, map) in self.0.iter().enumerate().filter(|(_, m)| !m.is_empty()) {
            seq.serialize_element(&(row as u64, map))?;
        }
        seq.end()
    }
}

#[derive(Serialize)]
struct WireRef<'a> {
    partition: &'a str,
    samples: &'a [SampleId],
    fields: &'a BTreeMap<FieldName, FieldMeta>,
    production: ProductionRef<'a>,
    tags: SparseRows<'a, String, super::TagValue>,
    backend_meta: SparseRows<'a, FieldName, bytes::Bytes>,
    lease: Option<LeaseId>,
    links: SparseRows<'a, FieldName, SampleId>,
}

#[derive(Deserialize)]
struct WireOwned {
    partition: String,
    samples: Vec<SampleId>,
    fields: BTreeMap<FieldName, FieldMeta>,
    production: ProductionOwned,
    tags: Vec<(u64, super::Tags)>,
    backend_meta: Vec<(u64, super::BackendMeta)>,
    lease: Option<LeaseId>,
    links: Vec<(u64, super::Links)>,
}

impl Serialize for BatchMeta {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let production = match self.production.first() {
            None => ProductionRef::All(false),
            Some(&first) if self.production.iter().all(|&p| p == first) => {
                ProductionRef::All(first)
            }
            Some(_) => ProductionRef::Each(&self.production),
        };
        WireRef {
            partition: &self.partition,
            samples: &self.samples,
            fields: &self.fields,
            production,
            tags: SparseRows(&self.tags),
            backend_meta: SparseRows(&self.backend_meta),
            lease: self.lease,
            links: SparseRows(&self.links),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for BatchMeta {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let wire = WireOwned::deserialize(d)?;
        BatchMeta::try_from(wire).map_err(serde::de::Error::custom)
    }
}

impl TryFrom<WireOwned> for BatchMeta {
    type Error = Error;

    fn try_from(w: WireOwned) -> Result<BatchMeta> {
        let n = w.samples.len();
        let production = match w.production {
            ProductionOwned::All(flag) => vec![flag; n],
            ProductionOwned::Each(flags) => flags,
        };
        BatchMeta::from_parts(BatchMetaParts {
            tags: dense_rows("tags", w.tags, n)?,
            backend_meta: dense_rows("backend meta", w.backend_meta, n)?,
            links: dense_rows("links", w.links, n)?,
            partition: w.partition,
            samples: w.samples,
            fields: w.fields,
            production,
            lease: w.lease,
        })
    }
}

/// One map per row out of the rows that have one; `Invalid` for a row past the batch or not
/// after the previous one.
fn dense_rows<K, V>(
    what: &str,
    present: Vec<(u64, BTreeMap<K, V>)>,
    rows: usize,
) -> Result<Vec<BTreeMap<K, V>>> {
    let mut out: Vec<BTreeMap<K, V>> = Vec::with_capacity(rows);
    for (row, map) in present {
        let fits = usize::try_from(row).is_ok_and(|r| r >= out.len() && r < rows);
        if !fits {
            return Err(Error::invalid(format!(
                "{what} of row {row}: rows must increase and stay under the batch's {rows} samples"
            )));
        }
        out.resize_with(row as usize, BTreeMap::new);
        out.push(map);
    }
    out.resize_with(rows, BTreeMap::new);
    Ok(out)
}

/// The layout of a [`BatchMeta`] before protocol 10, one entry per row in every per-row
/// vector, which the controller's snapshots and state dirs keep (their formats are pinned by
/// committed files and must go on loading): `#[serde(with = "tq_core::meta_snapshot_layout")]`.
pub mod snapshot_layout {
    use super::super::{BackendMeta, BatchMeta, BatchMetaParts, LeaseId, Links, SampleId, Tags};
    use crate::{FieldMeta, FieldName};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    #[derive(Serialize)]
    struct PerRowRef<'a> {
        partition: &'a str,
        samples: &'a [SampleId],
        fields: &'a BTreeMap<FieldName, FieldMeta>,
        production: &'a [bool],
        tags: &'a [Tags],
        backend_meta: &'a [BackendMeta],
        lease: Option<LeaseId>,
        links: &'a [Links],
    }

    #[derive(Deserialize)]
    struct PerRow {
        partition: String,
        samples: Vec<SampleId>,
        fields: BTreeMap<FieldName, FieldMeta>,
        production: Vec<bool>,
        tags: Vec<Tags>,
        backend_meta: Vec<BackendMeta>,
        lease: Option<LeaseId>,
        links: Vec<Links>,
    }

    pub fn serialize<S: Serializer>(meta: &BatchMeta, s: S) -> Result<S::Ok, S::Error> {
        PerRowRef {
            partition: &meta.partition,
            samples: &meta.samples,
            fields: &meta.fields,
            production: &meta.production,
            tags: &meta.tags,
            backend_meta: &meta.backend_meta,
            lease: meta.lease,
            links: &meta.links,
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BatchMeta, D::Error> {
        let r = PerRow::deserialize(d)?;
        BatchMeta::from_parts(BatchMetaParts {
            partition: r.partition,
            samples: r.samples,
            fields: r.fields,
            production: r.production,
            tags: r.tags,
            backend_meta: r.backend_meta,
            lease: r.lease,
            links: r.links,
        })
        .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, TagValue};

    fn sample_meta() -> BatchMeta {
        let samples: Vec<SampleId> = (0..5).map(|i| SampleId::new(i * 3, i)).collect();
        let mut tags = vec![super::super::Tags::new(); 5];
        tags[1].insert("score".into(), TagValue::Float(0.5));
        tags[4].insert("name".into(), TagValue::Str("x".into()));
        let mut backend_meta = vec![super::super::BackendMeta::new(); 5];
        backend_meta[0].insert("x".into(), bytes::Bytes::from_static(b"at"));
        let mut links = vec![super::super::Links::new(); 5];
        links[3].insert("x".into(), SampleId::new(99, 2));
        BatchMeta::from_parts(BatchMetaParts {
            partition: "p".into(),
            samples,
            fields: [("x".to_string(), FieldMeta::dense(DType::U8, vec![4]))].into(),
            production: vec![true, false, true, true, false],
            tags,
            backend_meta,
            lease: Some(7),
            links,
        })
        .unwrap()
    }

    #[test]
    fn round_trips_through_postcard_and_json() {
        let uniform = BatchMeta::new("q", vec![SampleId::new(1, 0), SampleId::new(2, 0)])
            .with_production(vec![true, true])
            .unwrap();
        for meta in [sample_meta(), uniform, BatchMeta::empty("e")] {
            let bytes = postcard::to_allocvec(&meta).unwrap();
            assert_eq!(postcard::from_bytes::<BatchMeta>(&bytes).unwrap(), meta);
            let text = serde_json::to_string(&meta).unwrap();
            assert_eq!(serde_json::from_str::<BatchMeta>(&text).unwrap(), meta);
        }
    }

    #[test]
    fn the_snapshot_layout_round_trips_and_keeps_one_entry_per_row() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct Kept(#[serde(with = "snapshot_layout")] BatchMeta);
        let meta = sample_meta();
        let bytes = postcard::to_allocvec(&Kept(meta.clone())).unwrap();
        assert_eq!(postcard::from_bytes::<Kept>(&bytes).unwrap().0, meta);
        // Five rows of tags, backend meta and links each, empty or not: longer than the wire's.
        assert!(bytes.len() > postcard::to_allocvec(&meta).unwrap().len());
    }

    #[test]
    fn empty_rows_cost_nothing_on_the_wire() {
        let n = 1024;
        let samples = (0..n).map(|i| SampleId::new(i, 0)).collect();
        let meta = BatchMeta::new("p", samples)
            .with_production(vec![true; n as usize])
            .unwrap();
        let bytes = postcard::to_allocvec(&meta).unwrap();
        // Per row: the sample id alone (index varint of 1-2 bytes, generation 1 byte).
        assert!(bytes.len() < 3 * n as usize + 32, "{} bytes", bytes.len());
    }

    #[test]
    fn rows_a_peer_gets_wrong_are_refused() {
        let wire = |tags: Vec<(u64, super::super::Tags)>, production| WireOwned {
            partition: "p".into(),
            samples: vec![SampleId::new(0, 0), SampleId::new(1, 0)],
            fields: BTreeMap::new(),
            production,
            tags,
            backend_meta: Vec::new(),
            lease: None,
            links: Vec::new(),
        };
        let tag = || super::super::Tags::from([("a".to_string(), TagValue::Int(1))]);
        for bad in [
            vec![(2, tag())],
            vec![(1, tag()), (1, tag())],
            vec![(1, tag()), (0, tag())],
            vec![(u64::MAX, tag())],
        ] {
            let err = BatchMeta::try_from(wire(bad.clone(), ProductionOwned::All(true)))
                .expect_err("refused");
            assert!(err.message().contains("tags of row"), "{bad:?}: {err}");
        }
        let short = BatchMeta::try_from(wire(Vec::new(), ProductionOwned::Each(vec![true])));
        assert!(short.unwrap_err().message().contains("production status"));
        let fine = BatchMeta::try_from(wire(vec![(1, tag())], ProductionOwned::All(true))).unwrap();
        assert!(fine.tags()[0].is_empty());
        assert_eq!(fine.tags()[1], tag());
    }
}
