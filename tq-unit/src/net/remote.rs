//! [`RemoteUnit`]: the stub through which a manager reaches a unit served by a [`super::UnitServer`].

use super::wire::*;
use crate::{Fetched, StorageUnit, UnitPut, UnitStats, UnitUpdate, UnitUpdateReply};
use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tq_core::cells::{CaptureInfo, CellPage};
use tq_core::{Error, FieldFilter, FieldName, MergeOp, Result, SampleId, Value};
use tq_net::{CallOptions, Endpoint, Message, Pool};

/// A storage unit reached over the network.
pub struct RemoteUnit {
    id: String,
    endpoint: Endpoint,
    pool: Pool,
    /// The controller epoch of the metadata this stub serves (0: none), sent with every request.
    /// Changes when a checkpoint is loaded ([`StorageUnit::enter_epoch`]).
    epoch: AtomicU64,
    /// The registration of the unit process this stub routes to (0: none), from the topology.
    registration: u64,
}

impl RemoteUnit {
    /// A stub for the unit `id` listening at `endpoint`, sharing `pool`'s connections.
    pub fn new(id: impl Into<String>, endpoint: Endpoint, pool: Pool) -> Self {
        RemoteUnit {
            id: id.into(),
            endpoint,
            pool,
            epoch: AtomicU64::new(0),
            registration: 0,
        }
    }

    /// Requests carry `registration` (the unit's, from the topology): a unit process that
    /// replaced the one this stub was made for refuses them, so the caller learns that what it
    /// wrote there is gone.
    pub fn with_registration(mut self, registration: u64) -> Self {
        self.registration = registration;
        self
    }

    /// Requests carry `epoch` (the controller's, from its topology): a unit that moved on to
    /// a later epoch refuses them instead of serving another sample at the same index.
    pub fn with_epoch(self, epoch: u64) -> Self {
        self.epoch.store(epoch, Ordering::Relaxed);
        self
    }

    fn envelope<'a>(&self, request: &'a UnitRequest) -> UnitEnvelope<&'a UnitRequest> {
        UnitEnvelope {
            epoch: self.epoch.load(Ordering::Relaxed),
            registration: self.registration,
            request,
        }
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    async fn call(&self, req: &UnitRequest, frames: Vec<Bytes>) -> Result<(UnitResponse, Message)> {
        let msg = Message::encode(&self.envelope(req), frames)?;
        let reply = self
            .pool
            .call(
                &self.endpoint,
                msg,
                CallOptions {
                    timeout: None,
                    idempotent: req.may_resend(),
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
        match self.call(&wire, frames).await?.0 {
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
                    idempotent: req.may_resend(),
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
        match self.call(&wire, frames).await?.0 {
            UnitResponse::Updated(r) => Ok(r),
            other => Err(self.unexpected("update", &other)),
        }
    }

    async fn clear(&self, samples: &[SampleId], fields: &FieldFilter) -> Result<()> {
        let req = UnitRequest::Clear {
            samples: samples.to_vec(),
            filter: fields.clone(),
        };
        match self.call(&req, Vec::new()).await?.0 {
            UnitResponse::Done => Ok(()),
            other => Err(self.unexpected("clear", &other)),
        }
    }

    async fn stats(&self) -> Result<UnitStats> {
        match self.call(&UnitRequest::Stats, Vec::new()).await?.0 {
            UnitResponse::Stats(s) => Ok(s),
            other => Err(self.unexpected("stats", &other)),
        }
    }

    async fn hold_writes(&self, ttl: Duration) -> Result<()> {
        let req = UnitRequest::Hold {
            ttl_ms: ttl.as_millis() as u64,
        };
        match self.call(&req, Vec::new()).await?.0 {
            UnitResponse::Done => Ok(()),
            other => Err(self.unexpected("checkpoint hold", &other)),
        }
    }

    async fn capture_cells(&self) -> Result<CaptureInfo> {
        match self.call(&UnitRequest::Capture, Vec::new()).await?.0 {
            UnitResponse::Captured(info) => Ok(info),
            other => Err(self.unexpected("checkpoint capture", &other)),
        }
    }

    async fn capture_page(&self, capture: u64, offset: u64, max_bytes: u64) -> Result<CellPage> {
        let req = UnitRequest::Page {
            capture,
            offset,
            max_bytes,
        };
        let (resp, reply) = self.call(&req, Vec::new()).await?;
        let UnitResponse::Page { fields, next } = resp else {
            return Err(self.unexpected("checkpoint page", &resp));
        };
        let peer = format!("checkpoint page of unit `{}`", self.id);
        FrameReader {
            frames: reply.frames.iter(),
            peer: &peer,
        }
        .page(fields, next)
    }

    async fn release_capture(&self, capture: Option<u64>) -> Result<()> {
        match self
            .call(&UnitRequest::Release { capture }, Vec::new())
            .await?
            .0
        {
            UnitResponse::Done => Ok(()),
            other => Err(self.unexpected("checkpoint release", &other)),
        }
    }

    /// Moves the stub and the unit it reaches to `epoch`.
    async fn enter_epoch(&self, epoch: u64) -> Result<()> {
        self.epoch.store(epoch, Ordering::Relaxed);
        match self.call(&UnitRequest::EnterEpoch, Vec::new()).await?.0 {
            UnitResponse::Done => Ok(()),
            other => Err(self.unexpected("epoch change", &other)),
        }
    }
}
