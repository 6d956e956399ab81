//! What crosses the network between a [`super::RemoteUnit`] and a [`super::UnitServer`].

use crate::{UnitOp, UnitRows, UnitStats, UnitUpdateReply};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tq_core::cells::{CaptureInfo, CellPage, FieldCells};
use tq_core::{DType, Error, FieldFilter, FieldName, MergeOp, Result, SampleId, Tensor, Value};

/// How one cell's frame is to be read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) enum CellDesc {
    Tensor { dtype: DType, shape: Vec<usize> },
    Object,
}

/// How the cells of one field are to be read, in row order. The rows of a dense column share
/// one dtype and shape, so they are described once (protocol 9: a per-cell description was a
/// shape allocated, encoded, decoded and freed per cell, a large part of a small-sample put's
/// cost); rows that differ (ragged, objects of a mixed field) are described one by one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) enum CellDescs {
    /// `count` cells, all described by `desc`.
    Same { desc: CellDesc, count: u64 },
    /// One description per cell.
    Each(Vec<CellDesc>),
}

impl CellDescs {
    /// The descriptions of `values`, once when they all agree.
    pub(super) fn of(values: &[Value]) -> CellDescs {
        match values.split_first() {
            Some((first, rest)) if rest.iter().all(|v| same_layout(first, v)) => CellDescs::Same {
                desc: desc_of(first),
                count: values.len() as u64,
            },
            _ => CellDescs::Each(values.iter().map(desc_of).collect()),
        }
    }

    /// How many cells these describe (saturating: a peer's count beyond the address space
    /// never matches a real one).
    pub(super) fn len(&self) -> usize {
        match self {
            CellDescs::Same { count, .. } => usize::try_from(*count).unwrap_or(usize::MAX),
            CellDescs::Each(descs) => descs.len(),
        }
    }

    /// Each cell's description, in row order. Check [`CellDescs::len`] against what the
    /// message can hold before iterating a peer's.
    pub(super) fn iter(&self) -> impl Iterator<Item = &CellDesc> {
        let (same, each) = match self {
            CellDescs::Same { desc, .. } => (Some(std::iter::repeat_n(desc, self.len())), None),
            CellDescs::Each(descs) => (None, Some(descs.iter())),
        };
        same.into_iter().flatten().chain(each.into_iter().flatten())
    }
}

/// Whether two cells are described alike (no allocation, unlike comparing descriptions).
fn same_layout(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Tensor(a), Value::Tensor(b)) => a.dtype() == b.dtype() && a.shape() == b.shape(),
        (Value::Object(_), Value::Object(_)) => true,
        _ => false,
    }
}

/// The rows of one field on the wire; the cells' bytes are the next frames in order.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct WireRows {
    pub(super) field: FieldName,
    pub(super) shared: bool,
    pub(super) cells: CellDescs,
}

/// The merge operations that can cross the network (closures cannot).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) enum WireMerge {
    Replace,
    Add,
    Max,
    Concat { dim: usize },
    Named(String),
}

impl WireMerge {
    pub(super) fn from_op(op: &MergeOp, unit: &str) -> Result<WireMerge> {
        Ok(match op {
            MergeOp::Replace => WireMerge::Replace,
            MergeOp::Add => WireMerge::Add,
            MergeOp::Max => WireMerge::Max,
            MergeOp::Concat { dim } => WireMerge::Concat { dim: *dim },
            MergeOp::Named(n) => WireMerge::Named(n.clone()),
            MergeOp::Custom(_) => {
                return Err(Error::unsupported(
                    "update with a closure merge",
                    format!("remote storage unit `{unit}` (register a named merge function on the unit instead)"),
                ))
            }
            other => {
                return Err(Error::unsupported(
                    format!("update with merge {other:?}"),
                    format!("remote storage unit `{unit}` (this merge cannot cross the network yet)"),
                ))
            }
        })
    }

    pub(super) fn into_op(self) -> MergeOp {
        match self {
            WireMerge::Replace => MergeOp::Replace,
            WireMerge::Add => MergeOp::Add,
            WireMerge::Max => MergeOp::Max,
            WireMerge::Concat { dim } => MergeOp::Concat { dim },
            WireMerge::Named(n) => MergeOp::Named(n),
        }
    }
}

/// Every unit request, with the controller epoch of the metadata it was made from and the
/// unit registration the sender routes to (0 for either: the sender does not know one).
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct UnitEnvelope<R> {
    pub(super) epoch: u64,
    /// Protocol 6: the registration of the unit process the sender learned from the topology;
    /// a unit that holds another one refuses the request (its sender wrote to a process that
    /// has since been replaced).
    pub(super) registration: u64,
    pub(super) request: R,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) enum UnitRequest {
    Put {
        samples: Vec<SampleId>,
        fields: Vec<WireRows>,
    },
    Get {
        fields: Vec<FieldName>,
        samples: Vec<SampleId>,
    },
    Update {
        samples: Vec<SampleId>,
        fields: Vec<WireRows>,
        merge: WireMerge,
    },
    Clear {
        samples: Vec<SampleId>,
        filter: FieldFilter,
    },
    Stats,
    /// Checkpoint steps (see `tq_core::cells`).
    Hold {
        ttl_ms: u64,
    },
    Capture,
    Page {
        capture: u64,
        offset: u64,
        max_bytes: u64,
    },
    Release {
        capture: Option<u64>,
    },
    /// The controller moved to the envelope's epoch (a checkpoint was loaded into it).
    EnterEpoch,
    /// Over the network: where this unit's shared-memory channel listens, if it offers one.
    SharedMemory,
    /// Over the shared-memory channel only: a put whose cells lie in the one segment the
    /// message carries, cell `i` (fields in order, rows in order) at `spans[i]`.
    PutShared {
        samples: Vec<SampleId>,
        fields: Vec<WireRows>,
        spans: Vec<(u64, u64)>,
    },
    /// Over the shared-memory channel only: a get answered with [`UnitResponse::GotShared`].
    GetShared {
        fields: Vec<FieldName>,
        samples: Vec<SampleId>,
    },
}

impl UnitRequest {
    /// The request's operation in the table (`ops.rs`), which gives its label and resend rule.
    pub(super) fn op(&self) -> UnitOp {
        match self {
            UnitRequest::Put { .. } => UnitOp::Put,
            UnitRequest::Update { .. } => UnitOp::Update,
            UnitRequest::Get { .. } => UnitOp::Get,
            UnitRequest::Clear { .. } => UnitOp::Clear,
            UnitRequest::Stats => UnitOp::Stats,
            UnitRequest::Hold { .. } => UnitOp::Hold,
            UnitRequest::Capture => UnitOp::Capture,
            UnitRequest::Page { .. } => UnitOp::Page,
            UnitRequest::Release { .. } => UnitOp::Release,
            UnitRequest::EnterEpoch => UnitOp::EnterEpoch,
            UnitRequest::SharedMemory => UnitOp::SharedMemory,
            UnitRequest::PutShared { .. } => UnitOp::Put,
            UnitRequest::GetShared { .. } => UnitOp::Get,
        }
    }

    /// Whether the transport may send it again after a lost answer (the table's rule).
    pub(super) fn may_resend(&self) -> bool {
        self.op().spec().resend == tq_core::Resend::Freely
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) enum UnitResponse {
    Done,
    /// Per requested field, the cells in sample order; their bytes are the frames in order.
    Got(Vec<CellDescs>),
    Updated(UnitUpdateReply),
    Stats(UnitStats),
    Captured(CaptureInfo),
    /// A page of a capture: per field, its samples and cells; the bytes are the frames in order.
    Page {
        fields: Vec<(FieldName, Vec<SampleId>, CellDescs)>,
        next: Option<u64>,
    },
    /// Where the unit's shared-memory channel listens (`None`: it offers none).
    SharedMemory(Option<ShmOffer>),
    /// A get over the shared-memory channel: per field, the cells in sample order, and for
    /// each cell (fields in order) where its bytes are.
    GotShared {
        cells: Vec<CellDescs>,
        places: Vec<Place>,
    },
}

/// How a client on the same host reaches a unit's shared-memory channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct ShmOffer {
    /// The Unix socket the channel listens on.
    pub(super) path: String,
    /// The kernel's boot id where the unit runs: a client elsewhere cannot share its memory.
    pub(super) host: String,
    /// Presented in the channel's hello, so only a peer that reached the unit over its
    /// (authenticated) network endpoint can use the channel.
    pub(super) secret: Vec<u8>,
}

/// Where the bytes of one cell of a shared-memory answer are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) enum Place {
    /// The message's next frame.
    Frame,
    /// In the answer's segment `segment` (its descriptors in order), at `offset`.
    Segment { segment: u32, offset: u64, len: u64 },
}

/// A capture page as a response and its frames.
pub(super) fn encode_page(page: CellPage) -> (UnitResponse, Vec<Bytes>) {
    let mut frames = Vec::new();
    let fields = page
        .fields
        .into_iter()
        .map(|fc| {
            let descs = describe(&fc.values, &mut frames);
            (fc.field, fc.samples, descs)
        })
        .collect();
    (
        UnitResponse::Page {
            fields,
            next: page.next,
        },
        frames,
    )
}

impl FrameReader<'_> {
    /// The page a [`UnitResponse::Page`] describes, over this reader's frames.
    pub(super) fn page(
        mut self,
        fields: Vec<(FieldName, Vec<SampleId>, CellDescs)>,
        next: Option<u64>,
    ) -> Result<CellPage> {
        let mut page = CellPage {
            fields: Vec::with_capacity(fields.len()),
            next,
        };
        for (field, samples, descs) in fields {
            if samples.len() != descs.len() {
                return Err(Error::corrupted(format!(
                    "{}: a page of field `{field}` lists {} samples and {} cells",
                    self.peer,
                    samples.len(),
                    descs.len()
                )));
            }
            let values = self.cells(&descs)?;
            page.fields.push(FieldCells {
                field,
                samples,
                values,
            });
        }
        self.finish()?;
        Ok(page)
    }
}

/// The descriptions of `values`, their bytes appended to `frames` in order.
pub(super) fn describe(values: &[Value], frames: &mut Vec<Bytes>) -> CellDescs {
    frames.extend(values.iter().map(|v| v.bytes().clone()));
    CellDescs::of(values)
}

/// How `value`'s bytes are to be read back.
pub(super) fn desc_of(value: &Value) -> CellDesc {
    match value {
        Value::Tensor(t) => CellDesc::Tensor {
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
        },
        Value::Object(_) => CellDesc::Object,
    }
}

impl WireRows {
    /// How `rows` of `field` are described on the wire (their bytes travel apart).
    pub(super) fn of(field: &FieldName, rows: &UnitRows) -> WireRows {
        WireRows {
            field: field.clone(),
            shared: rows.shared_allocation,
            cells: CellDescs::of(&rows.values),
        }
    }
}

/// The fields of a put or an update, their cells' bytes appended to `frames` in order.
pub(super) fn encode_fields(
    fields: &BTreeMap<FieldName, UnitRows>,
    frames: &mut Vec<Bytes>,
) -> Vec<WireRows> {
    fields
        .iter()
        .map(|(field, rows)| {
            frames.extend(rows.values.iter().map(|v| v.bytes().clone()));
            WireRows::of(field, rows)
        })
        .collect()
}

/// Rebuilds cells from their descriptions and the message's frames, in order. It owns the
/// frames, so each becomes its cell without another reference count round trip.
pub(super) struct FrameReader<'a> {
    pub(super) frames: std::vec::IntoIter<Bytes>,
    pub(super) peer: &'a str,
}

impl FrameReader<'_> {
    /// The next frame; a message with fewer frames than cells is corrupted.
    pub(super) fn next_frame(&mut self) -> Result<Bytes> {
        self.frames.next().ok_or_else(|| {
            Error::corrupted(format!(
                "{}: message has fewer frames than cells",
                self.peer
            ))
        })
    }

    /// The cell `desc` describes, over `bytes`.
    pub(super) fn cell(&self, desc: &CellDesc, bytes: Bytes) -> Result<Value> {
        Ok(match desc {
            CellDesc::Object => Value::Object(bytes),
            CellDesc::Tensor { dtype, shape } => Value::Tensor(
                Tensor::with_shape(*dtype, shape, bytes)
                    .map_err(|e| Error::corrupted(format!("{}: {}", self.peer, e.message())))?,
            ),
        })
    }

    pub(super) fn cells(&mut self, descs: &CellDescs) -> Result<Vec<Value>> {
        descs
            .iter()
            .map(|d| {
                let bytes = self.next_frame()?;
                self.cell(d, bytes)
            })
            .collect()
    }

    pub(super) fn fields(&mut self, wire: Vec<WireRows>) -> Result<BTreeMap<FieldName, UnitRows>> {
        let frames = self.frames.len();
        self.fields_from(wire, frames, |reader| reader.next_frame())
    }

    /// The fields of a put, each cell's bytes from `next_bytes` (the next frame, or the next
    /// span of a shared-memory segment), of which the message holds `available`: a
    /// description of more or fewer cells is refused before anything is allocated for them.
    fn fields_from(
        &mut self,
        wire: Vec<WireRows>,
        available: usize,
        mut next_bytes: impl FnMut(&mut Self) -> Result<Bytes>,
    ) -> Result<BTreeMap<FieldName, UnitRows>> {
        let described = wire
            .iter()
            .fold(0usize, |n, w| n.saturating_add(w.cells.len()));
        if described != available {
            return Err(Error::corrupted(format!(
                "{}: a put describes {described} cells and carries {available}",
                self.peer
            )));
        }
        let mut out = BTreeMap::new();
        for w in wire {
            let mut values = Vec::with_capacity(w.cells.len());
            for desc in w.cells.iter() {
                let bytes = next_bytes(self)?;
                values.push(self.cell(desc, bytes)?);
            }
            out.insert(
                w.field,
                UnitRows {
                    values,
                    shared_allocation: w.shared,
                },
            );
        }
        Ok(out)
    }

    /// The fields of a shared-memory put: cell `i` (fields in order) is `spans[i]` of the
    /// request's one segment.
    #[cfg(target_os = "linux")]
    pub(super) fn fields_in_segment(
        &mut self,
        wire: Vec<WireRows>,
        spans: &[(u64, u64)],
        segments: &[std::sync::Arc<super::shm::Segment>],
    ) -> Result<BTreeMap<FieldName, UnitRows>> {
        let [segment] = segments else {
            return Err(Error::corrupted(format!(
                "{}: a shared-memory put carries {} segments, not one",
                self.peer,
                segments.len()
            )));
        };
        let mut spans_left = spans.iter();
        self.fields_from(wire, spans.len(), |reader| {
            let (offset, len) = spans_left.next().copied().unwrap_or_default();
            segment
                .slice(offset, len)
                .map_err(|e| Error::corrupted(format!("{}: {}", reader.peer, e.message())))
        })
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn fields_in_segment(
        &mut self,
        _wire: Vec<WireRows>,
        _spans: &[(u64, u64)],
        _segments: &[std::convert::Infallible],
    ) -> Result<BTreeMap<FieldName, UnitRows>> {
        Err(Error::unsupported(
            "shared memory",
            "storage units off Linux",
        ))
    }

    pub(super) fn finish(mut self) -> Result<()> {
        match self.frames.next() {
            None => Ok(()),
            Some(_) => Err(Error::corrupted(format!(
                "{}: message has more frames than cells",
                self.peer
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tq_core::DType;

    fn rows(n: usize, len: usize) -> Vec<Value> {
        (0..n)
            .map(|i| Value::Tensor(Tensor::from_vec(vec![i as f32; len])))
            .collect()
    }

    fn header_len(values: &[Value]) -> usize {
        let wire = WireRows {
            field: "x".into(),
            shared: true,
            cells: CellDescs::of(values),
        };
        tq_net::Message::encode(&wire, Vec::new())
            .unwrap()
            .header
            .len()
    }

    #[test]
    fn a_dense_fields_rows_are_described_once() {
        let dense = rows(1024, 256);
        assert_eq!(
            CellDescs::of(&dense),
            CellDescs::Same {
                desc: CellDesc::Tensor {
                    dtype: DType::F32,
                    shape: vec![256],
                },
                count: 1024,
            }
        );
        // The header does not grow with the rows: 1 row or 1024 differ by the count's bytes.
        assert!(header_len(&dense) <= header_len(&dense[..1]) + 2);
        let descs = CellDescs::of(&dense);
        assert_eq!(descs.len(), 1024);
        assert_eq!(descs.iter().count(), 1024);
    }

    #[test]
    fn rows_that_differ_are_described_one_by_one_in_order() {
        let mut ragged = rows(3, 4);
        ragged.push(Value::Tensor(Tensor::from_vec(vec![1.0f32; 5])));
        ragged.push(Value::Object(Bytes::from_static(b"o")));
        let descs = CellDescs::of(&ragged);
        assert!(matches!(descs, CellDescs::Each(_)));
        let listed: Vec<CellDesc> = descs.iter().cloned().collect();
        let expected: Vec<CellDesc> = ragged.iter().map(desc_of).collect();
        assert_eq!(listed, expected);
        assert!(matches!(CellDescs::of(&[]), CellDescs::Each(v) if v.is_empty()));
    }

    /// The put of one frame of `frame_len` bytes whose field describes `count` cells of four
    /// f32 each, as a unit reads it.
    fn read_put(frame_len: usize, count: u64) -> Result<BTreeMap<FieldName, UnitRows>> {
        let mut reader = FrameReader {
            frames: vec![Bytes::from(vec![0u8; frame_len])].into_iter(),
            peer: "test peer",
        };
        let desc = CellDesc::Tensor {
            dtype: DType::F32,
            shape: vec![4],
        };
        reader.fields(vec![WireRows {
            field: "x".into(),
            shared: false,
            cells: CellDescs::Same { desc, count },
        }])
    }

    #[test]
    fn a_put_describing_more_cells_than_it_carries_is_refused_before_allocating() {
        let err = read_put(16, u64::MAX).unwrap_err();
        assert!(
            err.message().contains("describes") && err.message().contains("carries 1"),
            "{err}"
        );
        assert_eq!(read_put(16, 1).unwrap()["x"].values.len(), 1);
    }

    #[test]
    fn a_cell_whose_bytes_do_not_match_its_shape_is_corrupted() {
        let err = read_put(15, 1).unwrap_err();
        assert_eq!(*err.kind(), tq_core::ErrorKind::Corrupted, "{err}");
    }
}
