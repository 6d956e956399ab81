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
    /// Same-host shared memory: `None` when not wanted; else the link, made on first use
    /// (`None` inside when the unit cannot share memory with this process).
    #[cfg(target_os = "linux")]
    shm: Option<tokio::sync::OnceCell<Option<super::shm::ShmLink>>>,
    /// Set when the link failed in transport: payloads go over the network from then on.
    shm_off: std::sync::atomic::AtomicBool,
    /// The cell sizes of the fields this stub put or got (kept only with shared memory
    /// wanted): gets known to be small skip the channel.
    #[cfg(target_os = "linux")]
    sizes: super::shm::CellSizes,
    /// Gets answered through the shared-memory channel.
    shared_gets: AtomicU64,
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
            #[cfg(target_os = "linux")]
            shm: None,
            shm_off: std::sync::atomic::AtomicBool::new(false),
            #[cfg(target_os = "linux")]
            sizes: Default::default(),
            shared_gets: AtomicU64::new(0),
        }
    }

    /// Moves payloads through shared memory when the unit runs on this host and offers it
    /// (see [`super::UnitServer::offer_shared_memory`]); otherwise, and off Linux, they go
    /// over the network as without it. The first put or get asks the unit; a log line says
    /// when shared memory is not used and why.
    pub fn with_shared_memory(mut self, on: bool) -> Self {
        #[cfg(target_os = "linux")]
        {
            self.shm = on.then(tokio::sync::OnceCell::new);
        }
        #[cfg(not(target_os = "linux"))]
        let _ = on;
        self
    }

    /// Whether payloads to this unit go through shared memory (after the first put or get).
    pub fn uses_shared_memory(&self) -> bool {
        #[cfg(target_os = "linux")]
        {
            !self.shm_off.load(Ordering::Relaxed)
                && matches!(self.shm.as_ref().and_then(|c| c.get()), Some(Some(_)))
        }
        #[cfg(not(target_os = "linux"))]
        false
    }

    /// How many gets went through the shared-memory channel (the others went over the
    /// network: shared memory off or refused, or a get known to be small).
    pub fn gets_through_shared_memory(&self) -> u64 {
        self.shared_gets.load(Ordering::Relaxed)
    }

    /// The shared-memory link, asking the unit for it on first use.
    #[cfg(target_os = "linux")]
    async fn link(&self) -> Option<&super::shm::ShmLink> {
        let cell = self.shm.as_ref()?;
        if self.shm_off.load(Ordering::Relaxed) {
            return None;
        }
        cell.get_or_init(|| async {
            match self.negotiate().await {
                Ok(link) => {
                    tracing::info!(unit = %self.id, "payloads go through shared memory");
                    Some(link)
                }
                Err(e) => {
                    tracing::info!(unit = %self.id, reason = %e, "not using shared memory with this unit; payloads go over the network");
                    None
                }
            }
        })
        .await
        .as_ref()
    }

    #[cfg(target_os = "linux")]
    async fn negotiate(&self) -> Result<super::shm::ShmLink> {
        match self.call(&UnitRequest::SharedMemory, Vec::new()).await?.0 {
            UnitResponse::SharedMemory(Some(offer)) => {
                super::shm::ShmLink::connect(&self.id, offer).await
            }
            UnitResponse::SharedMemory(None) => Err(Error::unavailable(
                "the unit offers no shared-memory channel",
            )),
            other => Err(self.unexpected("shared-memory offer", &other)),
        }
    }

    /// After a transport error on the link: the network from now on.
    #[cfg(target_os = "linux")]
    fn give_up_shared_memory(&self, e: &Error) {
        if !self.shm_off.swap(true, Ordering::Relaxed) {
            tracing::warn!(unit = %self.id, reason = %e, "shared memory failed; payloads go over the network from now on");
        }
    }

    /// A put through a segment. `Err` is the link's (fall back); the inner result the unit's.
    #[cfg(target_os = "linux")]
    async fn put_shared(&self, link: &super::shm::ShmLink, req: &UnitPut) -> Result<Result<()>> {
        use std::os::fd::AsRawFd;
        let values = req.fields.values().flat_map(|r| r.values.iter());
        let parts: Vec<Bytes> = values.map(|v| v.bytes().clone()).collect();
        let (offsets, len) = super::shm::layout(parts.iter().map(Bytes::len));
        let spans = offsets
            .iter()
            .zip(&parts)
            .map(|(o, p)| (*o, p.len() as u64))
            .collect();
        // The copy into the segment is this put's one real cost (its pages are allocated as it
        // is written). On a thread of the blocking pool, so that the puts a manager makes to
        // several units at once (one task joining them) copy in parallel instead of in turn.
        let fd =
            tokio::task::spawn_blocking(move || super::shm::write_sealed(&parts, &offsets, len))
                .await
                .map_err(|e| Error::internal(format!("writing a shared-memory segment: {e}")))??;
        let fields = req
            .fields
            .iter()
            .map(|(field, rows)| WireRows::of(field, rows))
            .collect();
        let wire = UnitRequest::PutShared {
            samples: req.samples.clone(),
            fields,
            spans,
        };
        let msg = Message::encode(&self.envelope(&wire), Vec::new())?;
        let answer = link
            .call(msg, &[fd.as_raw_fd()], self.pool.config().request_timeout)
            .await?;
        Ok(
            answer.and_then(|(reply, _)| match reply.decode::<UnitResponse>()? {
                UnitResponse::Done => Ok(()),
                other => Err(self.unexpected("put", &other)),
            }),
        )
    }

    /// A get through the link. `Err` is the link's (fall back, `offered` untouched); the
    /// inner result the unit's.
    #[cfg(target_os = "linux")]
    async fn get_shared(
        &self,
        link: &super::shm::ShmLink,
        fields: &[FieldName],
        samples: &[SampleId],
        offered: &mut [Option<BytesMut>],
    ) -> Result<Result<Vec<Vec<Fetched>>>> {
        let req = UnitRequest::GetShared {
            fields: fields.to_vec(),
            samples: samples.to_vec(),
        };
        let msg = Message::encode(&self.envelope(&req), Vec::new())?;
        let (reply, fds) = match link
            .call(msg, &[], self.pool.config().request_timeout)
            .await?
        {
            Ok(answer) => answer,
            Err(e) => return Ok(Err(e.context(format!("storage unit `{}`", self.id)))),
        };
        Ok(self.read_shared(reply, fds, fields.len(), samples.len(), offered))
    }

    #[cfg(target_os = "linux")]
    fn read_shared(
        &self,
        reply: Message,
        fds: Vec<std::os::fd::OwnedFd>,
        fields: usize,
        samples: usize,
        offered: &mut [Option<BytesMut>],
    ) -> Result<Vec<Vec<Fetched>>> {
        use super::shm::Segment;
        let resp: UnitResponse = reply.decode()?;
        let UnitResponse::GotShared { cells, places } = resp else {
            return Err(self.unexpected("shared-memory get", &resp));
        };
        self.check_got(&cells, fields, samples)?;
        if places.len() != fields * samples {
            return Err(Error::corrupted(format!(
                "storage unit `{}` placed {} cells of a get of {}",
                self.id,
                places.len(),
                fields * samples
            )));
        }
        let segments = fds
            .into_iter()
            .map(Segment::map)
            .collect::<Result<Vec<_>>>()?;
        // Map each segment's pages in one call rather than a fault per page.
        let mut spans = vec![(u64::MAX, 0u64); segments.len()];
        // Rows of whole pages come back as views (the caller may map a column of them
        // together, see `join_shared_rows`); they are mapped in when joined or touched.
        let as_view = |offset: u64, len: u64| super::shm::joined::joinable(offset, len);
        for place in &places {
            if let Place::Segment {
                segment,
                offset,
                len,
            } = place
            {
                if as_view(*offset, *len) {
                    continue;
                }
                if let Some(span) = spans.get_mut(*segment as usize) {
                    span.0 = span.0.min(*offset);
                    span.1 = span.1.max(offset.saturating_add(*len));
                }
            }
        }
        for (segment, (start, end)) in segments.iter().zip(&spans) {
            if start < end {
                segment.populate(*start, end - start);
            }
        }
        let peer = format!("shared-memory reply of unit `{}`", self.id);
        let mut reader = FrameReader {
            frames: reply.frames.into_iter(),
            peer: &peer,
        };
        let mut places = places.into_iter();
        let mut offered = offered.iter_mut();
        let mut out = Vec::with_capacity(cells.len());
        for column in cells {
            let mut fetched = Vec::with_capacity(column.len());
            for desc in column.iter() {
                let buffer = offered.next().and_then(Option::take);
                let (bytes, view) = match places.next() {
                    Some(Place::Segment {
                        segment,
                        offset,
                        len,
                    }) => {
                        let Some(seg) = segments.get(segment as usize) else {
                            return Err(Error::corrupted(format!(
                                "{peer}: a cell in segment {segment} of {}",
                                segments.len()
                            )));
                        };
                        (seg.slice(offset, len)?, as_view(offset, len))
                    }
                    _ => (reader.next_frame()?, false),
                };
                let buffer = buffer.filter(|_| !view);
                fetched.push(match (buffer, desc) {
                    (Some(mut buf), CellDesc::Tensor { dtype, shape })
                        if buf.len() == bytes.len() =>
                    {
                        buf.copy_from_slice(&bytes);
                        Fetched::Placed {
                            dtype: *dtype,
                            shape: shape.clone(),
                            bytes: buf,
                        }
                    }
                    (_, desc) => Fetched::Value(reader.cell(desc, bytes)?),
                });
            }
            out.push(fetched);
        }
        reader.finish()?;
        Ok(out)
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
    fn check_got(&self, descs: &[CellDescs], fields: usize, samples: usize) -> Result<()> {
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
        // Sizing the payload only when shared memory is wanted keeps plain puts as they were.
        #[cfg(target_os = "linux")]
        if self.shm.is_some() && self.sizes.learn_put(&req.fields) >= super::shm::MIN_SHARED_PUT {
            if let Some(link) = self.link().await {
                match self.put_shared(link, &req).await {
                    Ok(answer) => return answer,
                    Err(e) => self.give_up_shared_memory(&e),
                }
            }
        }
        let mut frames = Vec::with_capacity(req.fields.values().map(|r| r.values.len()).sum());
        let fields = encode_fields(&req.fields, &mut frames);
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
        #[allow(unused_mut)]
        let mut offered: Vec<Option<BytesMut>> = buffers.into_iter().flatten().collect();
        #[cfg(target_os = "linux")]
        if self.shm.is_some() && !self.sizes.is_small_get(fields, samples.len()) {
            if let Some(link) = self.link().await {
                match self.get_shared(link, fields, samples, &mut offered).await {
                    Ok(answer) => {
                        self.shared_gets.fetch_add(1, Ordering::Relaxed);
                        if let Ok(cells) = &answer {
                            self.sizes.learn_got(fields, cells);
                        }
                        return answer;
                    }
                    Err(e) => self.give_up_shared_memory(&e),
                }
            }
        }
        let mut answer = self
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
            frames: std::mem::take(&mut answer.message.frames).into_iter(),
            peer: &peer,
        };
        let cells = descs
            .into_iter()
            .map(|column| {
                column
                    .iter()
                    .map(|desc| {
                        // A placed frame is empty in the message but still counted.
                        let frame = reader.next_frame()?;
                        match (placed.next().flatten(), desc) {
                            (Some(bytes), CellDesc::Tensor { dtype, shape }) => {
                                Ok(Fetched::Placed {
                                    dtype: *dtype,
                                    shape: shape.clone(),
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
        let fields = encode_fields(&req.fields, &mut frames);
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
            frames: reply.frames.into_iter(),
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
