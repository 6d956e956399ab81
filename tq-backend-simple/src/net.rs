//! Storage units over the network (feature `net`): [`UnitServer`] serves any [`StorageUnit`]
//! on a tq-net endpoint and [`RemoteUnit`] is the stub the manager uses to reach it.
//!
//! A request is one postcard header describing every cell (kind, dtype, shape) plus one body
//! frame per cell carrying its raw bytes. Payloads never pass through the encoder: they go out
//! as vectored writes of the stored `Bytes` and arrive as slices of the one receive buffer, which
//! the receiving unit stores directly (zero copy, tracked as one shared allocation per field).

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use tq_core::{DType, Error, FieldFilter, FieldName, MergeOp, Result, SampleId, Tensor, Value};
use tq_net::{CallOptions, Endpoint, Handler, Message, Pool};
use tq_unit::{Fetched, StorageUnit, UnitPut, UnitRows, UnitStats, UnitUpdate, UnitUpdateReply};

/// How one cell's frame is to be read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum CellDesc {
    Tensor { dtype: DType, shape: Vec<usize> },
    Object,
}

/// The rows of one field on the wire; the cells' bytes are the next frames in order.
#[derive(Debug, Serialize, Deserialize)]
struct WireRows {
    field: FieldName,
    shared: bool,
    cells: Vec<CellDesc>,
}

/// The merge operations that can cross the network (closures cannot).
#[derive(Debug, Clone, Serialize, Deserialize)]
enum WireMerge {
    Replace,
    Add,
    Max,
    Concat { dim: usize },
    Named(String),
}

impl WireMerge {
    fn from_op(op: &MergeOp, unit: &str) -> Result<WireMerge> {
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
        })
    }

    fn into_op(self) -> MergeOp {
        match self {
            WireMerge::Replace => MergeOp::Replace,
            WireMerge::Add => MergeOp::Add,
            WireMerge::Max => MergeOp::Max,
            WireMerge::Concat { dim } => MergeOp::Concat { dim },
            WireMerge::Named(n) => MergeOp::Named(n),
        }
    }
}

/// Every unit request, with the controller epoch of the metadata it was made from (0: the
/// sender does not know one).
#[derive(Debug, Serialize, Deserialize)]
struct UnitEnvelope<R> {
    epoch: u64,
    request: R,
}

#[derive(Debug, Serialize, Deserialize)]
enum UnitRequest {
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
}

#[derive(Debug, Serialize, Deserialize)]
enum UnitResponse {
    Done,
    /// Per requested field, the cells in sample order; their bytes are the frames in order.
    Got(Vec<Vec<CellDesc>>),
    Updated(UnitUpdateReply),
    Stats(UnitStats),
}

fn describe(values: &[Value], frames: &mut Vec<Bytes>) -> Vec<CellDesc> {
    values
        .iter()
        .map(|v| {
            frames.push(v.bytes().clone());
            match v {
                Value::Tensor(t) => CellDesc::Tensor {
                    dtype: t.dtype(),
                    shape: t.shape().to_vec(),
                },
                Value::Object(_) => CellDesc::Object,
            }
        })
        .collect()
}

fn encode_fields(fields: BTreeMap<FieldName, UnitRows>, frames: &mut Vec<Bytes>) -> Vec<WireRows> {
    fields
        .into_iter()
        .map(|(field, rows)| WireRows {
            cells: describe(&rows.values, frames),
            shared: rows.shared_allocation,
            field,
        })
        .collect()
}

/// Rebuilds cells from their descriptions and the message's frames, in order.
struct FrameReader<'a> {
    frames: std::slice::Iter<'a, Bytes>,
    peer: &'a str,
}

impl FrameReader<'_> {
    /// The next frame; a message with fewer frames than cells is corrupted.
    fn next_frame(&mut self) -> Result<Bytes> {
        self.frames.next().cloned().ok_or_else(|| {
            Error::corrupted(format!(
                "{}: message has fewer frames than cells",
                self.peer
            ))
        })
    }

    /// The cell `desc` describes, over `bytes`.
    fn cell(&self, desc: CellDesc, bytes: Bytes) -> Result<Value> {
        Ok(match desc {
            CellDesc::Object => Value::Object(bytes),
            CellDesc::Tensor { dtype, shape } => Value::Tensor(
                Tensor::new(dtype, shape, bytes)
                    .map_err(|e| Error::corrupted(format!("{}: {}", self.peer, e.message())))?,
            ),
        })
    }

    fn cells(&mut self, descs: Vec<CellDesc>) -> Result<Vec<Value>> {
        descs
            .into_iter()
            .map(|d| {
                let bytes = self.next_frame()?;
                self.cell(d, bytes)
            })
            .collect()
    }

    fn fields(&mut self, wire: Vec<WireRows>) -> Result<BTreeMap<FieldName, UnitRows>> {
        let mut out = BTreeMap::new();
        for w in wire {
            let values = self.cells(w.cells)?;
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

    fn finish(mut self) -> Result<()> {
        match self.frames.next() {
            None => Ok(()),
            Some(_) => Err(Error::corrupted(format!(
                "{}: message has more frames than cells",
                self.peer
            ))),
        }
    }
}

/// Makes an empty unit in place of one whose controller restarted without its state.
pub type UnitFactory = Box<dyn Fn() -> Result<Arc<dyn StorageUnit>> + Send + Sync>;

/// Serves one storage unit on the network.
///
/// The unit belongs to one controller epoch at a time: requests made from metadata of another
/// epoch are refused, and when the controller it registers with turns out to have restarted
/// without its state ([`UnitServer::adopt_epoch`]), the cells of the earlier epoch are dropped
/// (the unit is made anew by its factory), since no metadata can name them any more and the
/// new epoch reuses their indexes.
pub struct UnitServer {
    id: String,
    /// `None` while the unit is being made anew.
    unit: std::sync::RwLock<Option<Arc<dyn StorageUnit>>>,
    epoch: std::sync::atomic::AtomicU64,
    fresh: Option<UnitFactory>,
}

impl UnitServer {
    /// Serves `unit`, recording the storage role's request metrics for it (see
    /// [`tq_unit::MeteredUnit`]).
    pub fn new(unit: Arc<dyn StorageUnit>) -> Self {
        UnitServer {
            id: unit.id().to_string(),
            unit: std::sync::RwLock::new(Some(tq_unit::MeteredUnit::wrap(unit))),
            epoch: std::sync::atomic::AtomicU64::new(0),
            fresh: None,
        }
    }

    /// In `epoch` from the start (a unit in its controller's process).
    pub fn with_epoch(self, epoch: u64) -> Self {
        self.epoch
            .store(epoch, std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// How to make an empty unit when the controller's epoch changes. Without one, the
    /// earlier epoch's cells stay (unreachable) until the process restarts.
    pub fn with_factory(mut self, fresh: UnitFactory) -> Self {
        self.fresh = Some(fresh);
        self
    }

    /// The epoch this unit serves (0: none yet).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes the controller's epoch, as a registration answered it. A first epoch is simply
    /// adopted; a different one means the controller restarted without its state: the unit is
    /// made anew (its cells belong to metadata that no longer exists). Returns whether it was.
    /// If the new unit cannot be made yet (the old one's files are still in use by requests
    /// in flight), requests are refused as unavailable and the next registration tries again.
    pub fn adopt_epoch(&self, epoch: u64) -> Result<bool> {
        use std::sync::atomic::Ordering;
        let before = self.epoch();
        let missing = self.current().is_none();
        if before == epoch && !missing {
            return Ok(false);
        }
        if before == 0 {
            self.epoch.store(epoch, Ordering::Relaxed);
            return Ok(false);
        }
        let Some(fresh) = &self.fresh else {
            tracing::warn!(unit = %self.id, "the controller restarted without its state; this unit keeps the earlier epoch's cells until it restarts");
            self.epoch.store(epoch, Ordering::Relaxed);
            return Ok(false);
        };
        if before != epoch {
            tracing::warn!(
                unit = %self.id,
                old_epoch = %format_args!("{before:016x}"),
                new_epoch = %format_args!("{epoch:016x}"),
                "the controller restarted without its state; dropping the earlier epoch's cells"
            );
        }
        // The epoch changes first: from here on, requests of the earlier epoch are refused.
        self.epoch.store(epoch, Ordering::Relaxed);
        let old = self.unit.write().unwrap_or_else(|p| p.into_inner()).take();
        drop(old);
        let unit = tq_unit::MeteredUnit::wrap(fresh()?);
        *self.unit.write().unwrap_or_else(|p| p.into_inner()) = Some(unit);
        Ok(true)
    }

    /// The unit's counters (with the memory of this process), for a metrics endpoint.
    /// `Unavailable` while the unit is being made anew.
    pub async fn stats(&self) -> Result<tq_unit::UnitStats> {
        let Some(unit) = self.current() else {
            return Err(Error::unavailable(format!(
                "storage unit `{}` is dropping the cells of an earlier controller epoch",
                self.id
            )));
        };
        unit.stats().await
    }

    fn current(&self) -> Option<Arc<dyn StorageUnit>> {
        self.unit.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[async_trait]
impl Handler for UnitServer {
    async fn handle(&self, request: Message) -> Result<Message> {
        let envelope: UnitEnvelope<UnitRequest> = request.decode()?;
        let op = match &envelope.request {
            UnitRequest::Put { .. } => "PUT_DATA",
            UnitRequest::Update { .. } => "UPDATE_DATA",
            UnitRequest::Get { .. } => "GET_DATA",
            UnitRequest::Clear { .. } => "CLEAR_DATA",
            UnitRequest::Stats => "STATS",
        };
        tracing::debug!(unit = %self.id, op, "storage request");
        let ours = self.epoch();
        if envelope.epoch != 0 && ours != 0 && envelope.epoch != ours {
            // Refused before the unit sees it, so its meter does not: count it here.
            metrics::counter!("tq_storage_request_total", "op_type" => op).increment(1);
            metrics::counter!("tq_storage_request_errors_total", "op_type" => op).increment(1);
            return Err(tq_core::epoch_mismatch(
                &format!("storage unit `{}`", self.id),
                envelope.epoch,
                ours,
            ));
        }
        let Some(unit) = self.current() else {
            return Err(Error::unavailable(format!(
                "storage unit `{}` is dropping the cells of an earlier controller epoch",
                self.id
            )));
        };
        let req = envelope.request;
        let peer = format!("request to unit `{}`", unit.id());
        let mut reader = FrameReader {
            frames: request.frames.iter(),
            peer: &peer,
        };
        let response = match req {
            UnitRequest::Put { samples, fields } => {
                let fields = reader.fields(fields)?;
                reader.finish()?;
                unit.put(UnitPut { samples, fields }).await?;
                return Message::encode(&UnitResponse::Done, Vec::new());
            }
            UnitRequest::Update {
                samples,
                fields,
                merge,
            } => {
                let fields = reader.fields(fields)?;
                reader.finish()?;
                let reply = unit
                    .update(UnitUpdate { samples, fields }, &merge.into_op())
                    .await?;
                UnitResponse::Updated(reply)
            }
            UnitRequest::Get { fields, samples } => {
                reader.finish()?;
                let columns = unit.get(&fields, &samples).await?;
                let mut frames = Vec::with_capacity(columns.iter().map(Vec::len).sum());
                let descs = columns.iter().map(|c| describe(c, &mut frames)).collect();
                return Message::encode(&UnitResponse::Got(descs), frames);
            }
            UnitRequest::Clear { samples, filter } => {
                reader.finish()?;
                unit.clear(&samples, &filter).await?;
                UnitResponse::Done
            }
            UnitRequest::Stats => UnitResponse::Stats(unit.stats().await?),
        };
        Message::encode(&response, Vec::new())
    }
}

/// A storage unit reached over the network.
pub struct RemoteUnit {
    id: String,
    endpoint: Endpoint,
    pool: Pool,
    /// The controller epoch of the metadata this stub serves (0: none), sent with every request.
    epoch: u64,
}

impl RemoteUnit {
    /// A stub for the unit `id` listening at `endpoint`, sharing `pool`'s connections.
    pub fn new(id: impl Into<String>, endpoint: Endpoint, pool: Pool) -> Self {
        RemoteUnit {
            id: id.into(),
            endpoint,
            pool,
            epoch: 0,
        }
    }

    /// Requests carry `epoch` (the controller's, from its topology): a unit that moved on to
    /// a later epoch refuses them instead of serving another sample at the same index.
    pub fn with_epoch(mut self, epoch: u64) -> Self {
        self.epoch = epoch;
        self
    }

    fn envelope<'a>(&self, request: &'a UnitRequest) -> UnitEnvelope<&'a UnitRequest> {
        UnitEnvelope {
            epoch: self.epoch,
            request,
        }
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    async fn call(
        &self,
        req: &UnitRequest,
        frames: Vec<Bytes>,
        idempotent: bool,
    ) -> Result<(UnitResponse, Message)> {
        let msg = Message::encode(&self.envelope(req), frames)?;
        let reply = self
            .pool
            .call(
                &self.endpoint,
                msg,
                CallOptions {
                    timeout: None,
                    idempotent,
                },
            )
            .await
            .map_err(|e| e.context(format!("storage unit `{}`", self.id)))?;
        let resp: UnitResponse = reply.decode()?;
        Ok((resp, reply))
    }

    /// A get answer must describe every requested cell, and have one frame per cell.
    fn check_got(&self, descs: &[Vec<CellDesc>], fields: usize, samples: usize) -> Result<()> {
        if descs.len() != fields || descs.iter().any(|d| d.len() != samples) {
            return Err(Error::corrupted(format!(
                "storage unit `{}` answered a get of {fields} fields x {samples} samples with another shape",
                self.id,
            )));
        }
        Ok(())
    }

    fn unexpected(&self, what: &str, got: &UnitResponse) -> Error {
        Error::corrupted(format!(
            "storage unit `{}` answered a {what} with {got:?}",
            self.id
        ))
    }
}

#[async_trait]
impl StorageUnit for RemoteUnit {
    fn id(&self) -> &str {
        &self.id
    }

    /// Idempotent: writing the same cells of the same generation again changes nothing.
    async fn put(&self, req: UnitPut) -> Result<()> {
        let mut frames = Vec::with_capacity(req.fields.values().map(|r| r.values.len()).sum());
        let fields = encode_fields(req.fields, &mut frames);
        let wire = UnitRequest::Put {
            samples: req.samples,
            fields,
        };
        match self.call(&wire, frames, true).await?.0 {
            UnitResponse::Done => Ok(()),
            other => Err(self.unexpected("put", &other)),
        }
    }

    async fn get(&self, fields: &[FieldName], samples: &[SampleId]) -> Result<Vec<Vec<Value>>> {
        // A get that offers no buffers: every cell comes back as a value.
        self.get_into(fields, samples, Vec::new())
            .await?
            .into_iter()
            .map(|column| column.into_iter().map(Fetched::into_value).collect())
            .collect()
    }

    fn reads_into_buffers(&self) -> bool {
        true
    }

    async fn get_into(
        &self,
        fields: &[FieldName],
        samples: &[SampleId],
        buffers: Vec<Vec<Option<BytesMut>>>,
    ) -> Result<Vec<Vec<Fetched>>> {
        let req = UnitRequest::Get {
            fields: fields.to_vec(),
            samples: samples.to_vec(),
        };
        // The answer's frames are the cells field by field, rows in order: offer the buffers
        // in that order.
        let offered: Vec<Option<BytesMut>> = buffers.into_iter().flatten().collect();
        let answer = self
            .pool
            .call_into(
                &self.endpoint,
                Message::encode(&self.envelope(&req), Vec::new())?,
                CallOptions {
                    timeout: None,
                    idempotent: true,
                },
                offered,
            )
            .await
            .map_err(|e| e.context(format!("storage unit `{}`", self.id)))?;
        let resp: UnitResponse = answer.message.decode()?;
        let UnitResponse::Got(descs) = resp else {
            return Err(self.unexpected("get", &resp));
        };
        self.check_got(&descs, fields.len(), samples.len())?;
        let mut placed = answer.placed.into_iter();
        let peer = format!("reply of unit `{}`", self.id);
        let mut reader = FrameReader {
            frames: answer.message.frames.iter(),
            peer: &peer,
        };
        let cells = descs
            .into_iter()
            .map(|column| {
                column
                    .into_iter()
                    .map(|desc| {
                        // A placed frame is empty in the message but still counted.
                        let frame = reader.next_frame()?;
                        match (placed.next().flatten(), desc) {
                            (Some(bytes), CellDesc::Tensor { dtype, shape }) => {
                                Ok(Fetched::Placed {
                                    dtype,
                                    shape,
                                    bytes,
                                })
                            }
                            (Some(bytes), CellDesc::Object) => {
                                Ok(Fetched::Value(Value::Object(bytes.freeze())))
                            }
                            (None, desc) => Ok(Fetched::Value(reader.cell(desc, frame)?)),
                        }
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .collect::<Result<Vec<_>>>()?;
        reader.finish()?;
        Ok(cells)
    }

    /// Never retried: a lost answer leaves the outcome unknown, and merging twice is wrong.
    async fn update(&self, req: UnitUpdate, merge: &MergeOp) -> Result<UnitUpdateReply> {
        let merge = WireMerge::from_op(merge, &self.id)?;
        let mut frames = Vec::new();
        let fields = encode_fields(req.fields, &mut frames);
        let wire = UnitRequest::Update {
            samples: req.samples,
            fields,
            merge,
        };
        match self.call(&wire, frames, false).await?.0 {
            UnitResponse::Updated(r) => Ok(r),
            other => Err(self.unexpected("update", &other)),
        }
    }

    async fn clear(&self, samples: &[SampleId], fields: &FieldFilter) -> Result<()> {
        let req = UnitRequest::Clear {
            samples: samples.to_vec(),
            filter: fields.clone(),
        };
        match self.call(&req, Vec::new(), true).await?.0 {
            UnitResponse::Done => Ok(()),
            other => Err(self.unexpected("clear", &other)),
        }
    }

    async fn stats(&self) -> Result<UnitStats> {
        match self.call(&UnitRequest::Stats, Vec::new(), true).await?.0 {
            UnitResponse::Stats(s) => Ok(s),
            other => Err(self.unexpected("stats", &other)),
        }
    }
}
