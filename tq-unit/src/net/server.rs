//! [`UnitServer`]: serves one storage unit on a tq-net endpoint.

use super::wire::*;
use crate::{StorageUnit, UnitPut, UnitUpdate};
use async_trait::async_trait;
use std::sync::Arc;
use tq_core::{Error, Result};
use tq_net::{Handler, Message};

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
    /// The registration this process holds for its unit id (0: none yet).
    registration: std::sync::atomic::AtomicU64,
    fresh: Option<UnitFactory>,
    /// The same-host shared-memory channel, once offered ([`UnitServer::offer_shared_memory`]).
    #[cfg(target_os = "linux")]
    shm: std::sync::OnceLock<super::shm::ShmListener>,
}

impl UnitServer {
    /// Serves `unit`, recording the storage role's request metrics for it (see
    /// [`crate::MeteredUnit`]) and letting checkpoints hold its writes
    /// ([`crate::GatedUnit`]).
    pub fn new(unit: Arc<dyn StorageUnit>) -> Self {
        UnitServer {
            id: unit.id().to_string(),
            unit: std::sync::RwLock::new(Some(owned(unit))),
            epoch: std::sync::atomic::AtomicU64::new(0),
            registration: std::sync::atomic::AtomicU64::new(0),
            fresh: None,
            #[cfg(target_os = "linux")]
            shm: std::sync::OnceLock::new(),
        }
    }

    /// Offers clients on this host a shared-memory channel (see the `net::shm` module docs):
    /// an abstract Unix socket guarded by a random secret, announced (with the secret and the
    /// host's boot id) only to clients that ask over the authenticated network endpoint. Call
    /// it inside a Tokio runtime; a second call does nothing. Not available on other systems
    /// than Linux (an `Unsupported` error).
    pub fn offer_shared_memory(self: &Arc<Self>) -> Result<()> {
        #[cfg(target_os = "linux")]
        {
            if self.shm.get().is_none() {
                let listener = super::shm::ShmListener::start(Arc::downgrade(self), &self.id)?;
                let _ = self.shm.set(listener);
            }
            Ok(())
        }
        #[cfg(not(target_os = "linux"))]
        Err(Error::unsupported(
            "shared memory between a client and a unit",
            format!("storage unit `{}` (Linux only)", self.id),
        ))
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

    /// Takes the registration the controller answered (see `tq_controller` `net/registry.rs`):
    /// requests sent for another registration are refused from now on.
    pub fn adopt_registration(&self, registration: u64) {
        self.registration
            .store(registration, std::sync::atomic::Ordering::Relaxed);
    }

    /// The registration this unit holds (0: none yet).
    pub fn registration(&self) -> u64 {
        self.registration.load(std::sync::atomic::Ordering::Relaxed)
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
        let unit = owned(fresh()?);
        *self.unit.write().unwrap_or_else(|p| p.into_inner()) = Some(unit);
        Ok(true)
    }

    /// The unit's counters (with the memory of this process), for a metrics endpoint.
    /// `Unavailable` while the unit is being made anew.
    pub async fn stats(&self) -> Result<crate::UnitStats> {
        let Some(unit) = self.current() else {
            return Err(Error::unavailable(format!(
                "storage unit `{}` is dropping the cells of an earlier controller epoch",
                self.id
            )));
        };
        unit.stats().await
    }

    /// The unit being served, for a client in this process that calls it directly (see
    /// `tq::server::Deployment::local_client`): it sees the same cells as remote requests,
    /// with the same metering and checkpoint gate. `Unavailable` while the unit is being made
    /// anew; a unit made anew later (another controller epoch) is not the one returned.
    pub fn unit(&self) -> Result<Arc<dyn StorageUnit>> {
        self.current().ok_or_else(|| {
            Error::unavailable(format!(
                "storage unit `{}` is dropping the cells of an earlier controller epoch",
                self.id
            ))
        })
    }

    fn current(&self) -> Option<Arc<dyn StorageUnit>> {
        self.unit.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[async_trait]
impl Handler for UnitServer {
    async fn handle(&self, request: Message) -> Result<Message> {
        self.serve(request, None).await.map(|(reply, _)| reply)
    }
}

/// Segments a request brought or an answer takes along (the shared-memory channel's).
#[cfg(target_os = "linux")]
pub(super) type Segments = Vec<Arc<super::shm::Segment>>;
#[cfg(not(target_os = "linux"))]
pub(super) type Segments = Vec<std::convert::Infallible>;

impl UnitServer {
    /// Answers one request. `attached` is `None` for a request from the network and the
    /// segments it carried for one from the shared-memory channel, where the answer may
    /// carry segments too.
    pub(super) async fn serve(
        &self,
        request: Message,
        attached: Option<Segments>,
    ) -> Result<(Message, Segments)> {
        let envelope: UnitEnvelope<UnitRequest> = request.decode().map_err(|e| {
            // Most likely a client pointed at this unit's address instead of its controller's.
            Error::invalid(format!(
                "this is storage unit `{}`, not a controller: clients connect to the \
                 controller's address (the request does not decode as a storage request: {})",
                self.id,
                e.message()
            ))
        })?;
        let op = envelope.request.op().label();
        tracing::debug!(unit = %self.id, op, "storage request");
        if let UnitRequest::EnterEpoch = envelope.request {
            self.adopt_epoch(envelope.epoch)?;
            return plain(&UnitResponse::Done, Vec::new());
        }
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
        let held = self.registration();
        // A sender that routes to an earlier holder of this id wrote its cells to a process
        // that is gone: what it misses here is lost, not "not found".
        let replaced_since =
            (envelope.registration != 0 && held != 0 && envelope.registration < held)
                .then_some(envelope.registration);
        let Some(unit) = self.current() else {
            return Err(Error::unavailable(format!(
                "storage unit `{}` is dropping the cells of an earlier controller epoch",
                self.id
            )));
        };
        let req = envelope.request;
        let peer = format!("request to unit `{}`", unit.id());
        let mut reader = FrameReader {
            frames: request.frames.into_iter(),
            peer: &peer,
        };
        let response = match req {
            UnitRequest::Put { samples, fields } => {
                let fields = reader.fields(fields)?;
                reader.finish()?;
                unit.put(UnitPut { samples, fields }).await?;
                return plain(&UnitResponse::Done, Vec::new());
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
                let columns = unit
                    .get(&fields, &samples)
                    .await
                    .map_err(|e| explain_missing(e, &self.id, replaced_since, held))?;
                let mut frames = Vec::with_capacity(columns.iter().map(Vec::len).sum());
                let descs = columns.iter().map(|c| describe(c, &mut frames)).collect();
                return plain(&UnitResponse::Got(descs), frames);
            }
            UnitRequest::Clear { samples, filter } => {
                reader.finish()?;
                unit.clear(&samples, &filter).await?;
                UnitResponse::Done
            }
            UnitRequest::Stats => UnitResponse::Stats(unit.stats().await?),
            UnitRequest::Hold { ttl_ms } => {
                unit.hold_writes(std::time::Duration::from_millis(ttl_ms))
                    .await?;
                UnitResponse::Done
            }
            UnitRequest::Capture => UnitResponse::Captured(unit.capture_cells().await?),
            UnitRequest::Page {
                capture,
                offset,
                max_bytes,
            } => {
                let page = unit.capture_page(capture, offset, max_bytes).await?;
                let (response, frames) = encode_page(page);
                return plain(&response, frames);
            }
            UnitRequest::Release { capture } => {
                unit.release_capture(capture).await?;
                UnitResponse::Done
            }
            UnitRequest::EnterEpoch => UnitResponse::Done,
            UnitRequest::SharedMemory => UnitResponse::SharedMemory(self.shm_offer()),
            UnitRequest::PutShared {
                samples,
                fields,
                spans,
            } => {
                let segments = shared_only(attached, &self.id)?;
                let fields = reader.fields_in_segment(fields, &spans, &segments)?;
                reader.finish()?;
                unit.put(UnitPut { samples, fields }).await?;
                UnitResponse::Done
            }
            UnitRequest::GetShared { fields, samples } => {
                shared_only(attached, &self.id)?;
                reader.finish()?;
                let columns = unit
                    .get(&fields, &samples)
                    .await
                    .map_err(|e| explain_missing(e, &self.id, replaced_since, held))?;
                return shared_answer(columns);
            }
        };
        plain(&response, Vec::new())
    }

    #[cfg(target_os = "linux")]
    pub(super) fn shm_offer(&self) -> Option<ShmOffer> {
        self.shm.get().map(|l| l.offer())
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn shm_offer(&self) -> Option<ShmOffer> {
        None
    }
}

/// An answer with no segments.
fn plain(response: &UnitResponse, frames: Vec<bytes::Bytes>) -> Result<(Message, Segments)> {
    Ok((Message::encode(response, frames)?, Vec::new()))
}

/// The segments of a request that only the shared-memory channel may carry.
fn shared_only(attached: Option<Segments>, unit: &str) -> Result<Segments> {
    attached.ok_or_else(|| {
        Error::invalid(format!(
            "storage unit `{unit}`: shared-memory requests come over its shared-memory channel, \
             not over the network"
        ))
    })
}

/// A get's cells for the shared-memory channel: those that lie in a segment of this process
/// go as the segment's descriptor and an offset, the rest as frames.
#[cfg(target_os = "linux")]
fn shared_answer(columns: Vec<Vec<tq_core::Value>>) -> Result<(Message, Segments)> {
    use super::shm::Segment;
    let cells: usize = columns.iter().map(Vec::len).sum();
    let mut frames = Vec::new();
    let mut places = Vec::with_capacity(cells);
    let mut segments: Segments = Vec::new();
    let mut descs = Vec::with_capacity(columns.len());
    for column in &columns {
        descs.push(CellDescs::of(column));
        for value in column {
            let bytes = value.bytes();
            let place = Segment::containing(bytes).and_then(|(segment, offset)| {
                let index = match segments.iter().position(|s| Arc::ptr_eq(s, &segment)) {
                    Some(i) => i,
                    None if segments.len() < super::shm::MAX_SEGMENTS_PER_ANSWER => {
                        segments.push(segment);
                        segments.len() - 1
                    }
                    None => return None,
                };
                Some(Place::Segment {
                    segment: index as u32,
                    offset,
                    len: bytes.len() as u64,
                })
            });
            places.push(place.unwrap_or_else(|| {
                frames.push(bytes.clone());
                Place::Frame
            }));
        }
    }
    let response = UnitResponse::GotShared {
        cells: descs,
        places,
    };
    Ok((Message::encode(&response, frames)?, segments))
}

#[cfg(not(target_os = "linux"))]
fn shared_answer(_columns: Vec<Vec<tq_core::Value>>) -> Result<(Message, Segments)> {
    Err(Error::unsupported(
        "shared memory",
        "storage units off Linux",
    ))
}

/// A read that misses cells, from a sender that routes to registration `sent` of this unit id
/// while this process holds `held` (a later one): the cells were written to a process that has
/// been replaced, so they are lost (`DataLost`, not retried), and the message says so.
/// A get's `NotFound` from a sender that routes to a replaced holder of this unit id is
/// `DataLost` (see [`replaced`]); every other error stays as it is.
fn explain_missing(e: Error, id: &str, replaced_since: Option<u64>, held: u64) -> Error {
    match replaced_since {
        Some(sent) if e.kind() == &tq_core::ErrorKind::NotFound => replaced(id, sent, held, e),
        _ => e,
    }
}

fn replaced(id: &str, sent: u64, held: u64, missing: Error) -> Error {
    Error::data_lost(format!(
        "storage unit `{id}` was replaced since this client connected (it routes to \
         registration {sent}, this process is registration {held}): cells written to the \
         earlier process are gone ({})",
        missing.message()
    ))
    .with_retry(tq_core::Retry::Never)
}

/// A unit as its server keeps it: metered, behind the gate through which checkpoints hold
/// its writes.
fn owned(unit: Arc<dyn StorageUnit>) -> Arc<dyn StorageUnit> {
    crate::MeteredUnit::wrap(crate::GatedUnit::wrap(unit))
}
