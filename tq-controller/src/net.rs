//! The controller over the network (feature `net`): [`ControllerServer`] serves a [`Controller`]
//! (plus the registry of storage units) on a tq-net endpoint, and [`RemoteControlPlane`] is the
//! client-side stub implementing [`ControlPlane`], so client code is the same embedded or remote.

use crate::api::*;
use crate::checkpoint::SnapshotCounts;
use crate::ops::ControlRequest;
use crate::{ControlAdmin, Controller, ControllerOp, MeteredPlane};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tq_core::{BackendMeta, BatchMeta, Bytes, Error, Result};
use tq_net::{CallOptions, Endpoint, Handler, Message, Pool};

/// A storage unit known to the controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitInfo {
    /// Stable name; a unit that restarts registers again under the same id.
    pub id: String,
    /// Where clients reach it (`tcp://host:port` or `unix:///path`).
    pub endpoint: String,
    /// Drawn by the unit process when it starts: tells a unit that registers again from
    /// another process claiming the same id (see `net/registry.rs`).
    pub instance: u64,
    /// Grows each time another process takes the id; clients send it with every unit request,
    /// so a replaced unit's clients are told. A unit sends the one it holds (0 at first).
    pub registration: u64,
}

/// The storage units, in routing order: sample index `i` lives on `units[i % expected_units]`;
/// or, for shared storage, its description.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    pub expected_units: u32,
    pub units: Vec<UnitInfo>,
    /// The `[storage]` section of the controller's configuration (TOML) when the payloads live
    /// in a store every process reaches directly (a KV backend, or a custom one) instead of in
    /// registered storage units. Clients build the same storage from it, so all processes use
    /// the same stores, routing and TTL. It may hold credentials (store URLs): it is only sent
    /// to peers that passed the handshake, and never logged.
    pub storage: Option<String>,
    /// The controller's epoch (see `tq_core::new_epoch`): clients and units send it with every
    /// request, and a controller restarted without its state refuses the old one.
    pub epoch: u64,
}

impl std::fmt::Debug for Topology {
    /// The storage description may carry credentials: only its size is shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Topology")
            .field("expected_units", &self.expected_units)
            .field("epoch", &format_args!("{:016x}", self.epoch))
            .field("units", &self.units)
            .field(
                "storage",
                &self
                    .storage
                    .as_ref()
                    .map(|s| format!("<redacted, {} bytes>", s.len())),
            )
            .finish()
    }
}

impl Topology {
    /// True when every expected unit has registered.
    pub fn is_complete(&self) -> bool {
        self.units.len() == self.expected_units as usize
    }
}

/// Every controller request, with the epoch of the metadata it carries (0: not known yet — a
/// first topology request, a unit registering).
#[derive(Debug, Serialize, Deserialize)]
struct ControlEnvelope {
    epoch: u64,
    request: ControlRequest,
    /// A request that must not be applied twice (an insert, an at-most-once fetch, a production
    /// notice) names itself, so that a retry gets the first answer (protocol 6;
    /// `Controller::get_meta_once`, `Controller::notify_once`).
    once: Option<RequestId>,
}

/// The longest hold on removals a peer may ask for: a checkpoint that dies must not stall
/// clears for longer.
pub const MAX_REMOVAL_HOLD: Duration = Duration::from_secs(600);

/// Every controller answer. A new reply type goes at the end (the order is the encoding) and
/// gets its line in the reply map below.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum ControlResponse {
    Done,
    Meta(BatchMeta),
    KvMeta(KvMeta),
    KvList(Vec<KeyListing>),
    Production(ProductionStatus),
    Consumption(ConsumptionStatus),
    Partitions(Vec<String>),
    Acked(usize),
    Topology(Topology),
    Holds(Vec<bool>),
    /// What a production notice replaced (protocol 4).
    Replaced(Vec<BackendMeta>),
    /// A unit registered: the controller's epoch and the unit's registration (protocol 6).
    Registered {
        epoch: u64,
        registration: u64,
    },
    /// A snapshot (its bytes are the body frame) or a restore: what it holds.
    Snapshot(SnapshotCounts),
    Status(ControllerStatus),
    /// A snapshot (body frame) taken with a hold on removals: what it holds and the hold.
    HeldSnapshot {
        counts: SnapshotCounts,
        hold: u64,
    },
}

/// A reply type of the operation table as its [`ControlResponse`].
pub(crate) trait WireReply: Sized {
    fn into_response(self) -> ControlResponse;
    /// The reply, or the response back (boxed: it is large, and this is the error path) when
    /// it is another kind.
    fn from_response(response: ControlResponse) -> std::result::Result<Self, Box<ControlResponse>>;
}

/// The reply map: which response carries each reply type of the operation table.
macro_rules! wire_replies {
    ($($reply:ty => $variant:ident),* $(,)?) => {$(
        impl WireReply for $reply {
            fn into_response(self) -> ControlResponse {
                ControlResponse::$variant(self)
            }
            fn from_response(response: ControlResponse) -> std::result::Result<Self, Box<ControlResponse>> {
                match response {
                    ControlResponse::$variant(reply) => Ok(reply),
                    other => Err(Box::new(other)),
                }
            }
        }
    )*};
}

wire_replies! {
    BatchMeta => Meta,
    KvMeta => KvMeta,
    Vec<KeyListing> => KvList,
    ProductionStatus => Production,
    ConsumptionStatus => Consumption,
    Vec<String> => Partitions,
    usize => Acked,
    Vec<bool> => Holds,
    Vec<BackendMeta> => Replaced,
}

impl WireReply for () {
    fn into_response(self) -> ControlResponse {
        ControlResponse::Done
    }
    fn from_response(response: ControlResponse) -> std::result::Result<Self, Box<ControlResponse>> {
        match response {
            ControlResponse::Done => Ok(()),
            other => Err(Box::new(other)),
        }
    }
}

/// Serves a controller and the unit registry.
pub struct ControllerServer {
    controller: Arc<Controller>,
    /// The controller behind its request metrics: every request is dispatched through it.
    plane: MeteredPlane<Controller>,
    /// The serving socket's open connections, reported by status requests.
    connections: std::sync::OnceLock<tq_net::ConnectionCount>,
    registry: Mutex<registry::Registry>,
    /// With `--state-dir`: changes are durable before they are answered.
    state_dir: Option<Arc<crate::StateDir>>,
    /// With shared storage: the claim on the epoch this controller serves (see
    /// [`ControllerServer::with_epoch_claim`]).
    claim: Option<EpochClaim>,
}

/// A controller's claim on its epoch of shared storage.
struct EpochClaim {
    storage: Arc<dyn tq_core::StorageManager>,
    owner: u64,
}

impl ControllerServer {
    /// Serves `controller`, expecting `expected_units` storage units to register.
    pub fn new(controller: Arc<Controller>, expected_units: u32) -> Self {
        let epoch = controller.epoch();
        ControllerServer {
            plane: MeteredPlane::new(controller.clone()),
            controller,
            connections: Default::default(),
            registry: Mutex::new(registry::Registry::new(Topology {
                expected_units,
                units: Vec::new(),
                storage: None,
                epoch,
            })),
            state_dir: None,
            claim: None,
        }
    }

    /// The controller's epoch.
    pub fn epoch(&self) -> u64 {
        self.controller.epoch()
    }

    /// The controller being served (to register samplers before clients connect, say).
    pub fn controller(&self) -> &Arc<Controller> {
        &self.controller
    }

    /// Keeps the controller's state in `dir` (see [`crate::StateDir`]): the state found there
    /// is restored first (so call this before serving), and from then on every change is on
    /// disk before it is answered.
    pub fn with_state_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Result<Self> {
        self.state_dir = Some(crate::StateDir::open(dir, self.controller.clone())?);
        Ok(self)
    }

    /// Serves `controller` whose payloads live in the storage `storage` describes (the
    /// `[storage]` section of a configuration, TOML), which every client builds for itself;
    /// no storage unit registers.
    pub fn with_shared_storage(controller: Arc<Controller>, storage: String) -> Self {
        let epoch = controller.epoch();
        ControllerServer {
            plane: MeteredPlane::new(controller.clone()),
            controller,
            connections: Default::default(),
            registry: Mutex::new(registry::Registry::new(Topology {
                expected_units: 0,
                units: Vec::new(),
                storage: Some(storage),
                epoch,
            })),
            state_dir: None,
            claim: None,
        }
    }

    /// Claims the controller's epoch of the shared `storage` for `owner` (see
    /// [`tq_core::StorageManager::claim_epoch`]): before a restore (a checkpoint's epoch must
    /// not be served by a live controller), and through [`ControllerServer::claim_epoch`]
    /// and [`ControllerServer::renew_claim`], which the process calls before serving and then
    /// forever.
    pub fn with_epoch_claim(
        mut self,
        storage: Arc<dyn tq_core::StorageManager>,
        owner: u64,
    ) -> Self {
        self.claim = Some(EpochClaim { storage, owner });
        self
    }

    /// Claims the epoch served now; `Conflict` (with [`tq_core::EPOCH_CLAIMED`]) while
    /// another live controller owns it.
    pub async fn claim_epoch(&self) -> Result<()> {
        match &self.claim {
            Some(c) => c.storage.claim_epoch(self.epoch(), c.owner).await,
            None => Ok(()),
        }
    }

    /// Renews the claim every third of its lease, forever; failures are logged (a refusal
    /// means another controller took this epoch over: this one must be stopped).
    pub async fn renew_claim(&self) {
        if self.claim.is_none() {
            return std::future::pending().await;
        }
        loop {
            tokio::time::sleep(tq_core::EPOCH_CLAIM_LEASE / 3).await;
            if let Err(e) = self.claim_epoch().await {
                tracing::error!(error = %e, epoch = %format_args!("{:016x}", self.epoch()), "cannot renew this controller's claim on its epoch of the shared storage");
            }
        }
    }

    /// Reports `count` (the serving socket's, see `tq_net::Server::connection_count`) as the
    /// controller's connections in status answers. Set once; later calls are ignored.
    pub fn count_connections(&self, count: tq_net::ConnectionCount) {
        let _ = self.connections.set(count);
    }

    /// What the controller holds, with this server's open connections.
    pub fn status(&self) -> ControllerStatus {
        let mut status = self.controller.status();
        status.connections = self.connections.get().map_or(0, |c| c.open() as u64);
        status
    }

    /// Adds a unit in this process (never lapses); see [`ControllerServer::register_remote_unit`].
    pub fn register_unit(&self, info: UnitInfo) -> Result<u64> {
        self.registry()
            .register(info, false, std::time::Instant::now())
    }

    /// Adds a unit that registers over the network, or refreshes one that registered before;
    /// returns its registration. A second process under an id whose holder still registers is
    /// refused (`Conflict`, naming the holder); see `net/registry.rs`.
    pub fn register_remote_unit(&self, info: UnitInfo) -> Result<u64> {
        self.registry()
            .register(info, true, std::time::Instant::now())
    }

    /// Units that stopped registering (dead or cut off), with how long ago they last did.
    pub fn lapsed_units(&self) -> Vec<(String, Duration)> {
        self.registry().lapsed(std::time::Instant::now())
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, registry::Registry> {
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn topology(&self) -> Topology {
        let mut t = self.registry().topology.clone();
        // A restored checkpoint brings its epoch.
        t.epoch = self.epoch();
        t
    }

    /// Answers a request: a data-path one through the operation table's dispatch, the
    /// server's own (registration, topology, status, checkpoints) here.
    async fn dispatch(&self, req: ControlRequest, body: Option<Bytes>) -> Result<ControlResponse> {
        let req = match crate::ops::dispatch(&self.plane, req).await {
            Ok(answer) => return answer,
            Err(server_request) => server_request,
        };
        Ok(match req {
            ControlRequest::RegisterUnit(info) => {
                let registration = self.register_remote_unit(info)?;
                ControlResponse::Registered {
                    epoch: self.epoch(),
                    registration,
                }
            }
            ControlRequest::Topology => ControlResponse::Topology(self.topology()),
            ControlRequest::Status => ControlResponse::Status(self.status()),
            ControlRequest::ReleaseRemovals { hold } => {
                self.controller.release_removals(hold);
                ControlResponse::Done
            }
            ControlRequest::Restore => {
                let body = body.ok_or_else(|| {
                    Error::invalid("a restore request carries the snapshot as one body frame")
                })?;
                if let Some(c) = &self.claim {
                    // A checkpoint's epoch may still be served by the controller it came from.
                    let epoch = crate::snapshot_epoch(&body)?;
                    c.storage.claim_epoch(epoch, c.owner).await?;
                }
                ControlResponse::Snapshot(self.controller.restore(&body)?)
            }
            // Answered in `handle` (the snapshot travels as a body frame), and every data-path
            // request by the table's dispatch.
            other => {
                return Err(Error::internal(format!(
                    "{} reached the server's dispatch",
                    other.op().name()
                )))
            }
        })
    }
}

#[async_trait]
impl Handler for ControllerServer {
    async fn handle(&self, request: Message) -> Result<Message> {
        let envelope: ControlEnvelope = match request.decode() {
            Ok(envelope) => envelope,
            Err(e) => {
                self.plane
                    .meter()
                    .rejected(ControllerOp::Undecodable.index());
                return Err(Error::invalid(format!(
                    "this is a tq controller, and the request does not decode as a controller \
                     request (a storage-unit request goes to the unit's own address): {}",
                    e.message()
                )));
            }
        };
        let op = envelope.request.op();
        tracing::debug!(op = op.name(), "controller request");
        let body = match (&envelope.request, request.frames.as_slice()) {
            (ControlRequest::Restore, [one]) => Some(one.clone()),
            (_, []) => None,
            _ => {
                self.plane.meter().rejected(op.index());
                return Err(Error::invalid(
                    "controller requests carry no body frames (a restore carries one)",
                ));
            }
        };
        if envelope.epoch != 0 && envelope.epoch != self.epoch() {
            self.plane.meter().rejected(op.index());
            return Err(tq_core::epoch_mismatch(
                "the controller",
                envelope.epoch,
                self.epoch(),
            ));
        }
        if let ControlRequest::Snapshot = envelope.request {
            let (bytes, counts) = self.controller.snapshot()?;
            return Message::encode(&ControlResponse::Snapshot(counts), vec![Bytes::from(bytes)]);
        }
        if let ControlRequest::SnapshotHoldingRemovals { ttl_ms } = envelope.request {
            let ttl = Duration::from_millis(ttl_ms).min(MAX_REMOVAL_HOLD);
            let (bytes, counts, hold) = self.controller.snapshot_holding_removals(ttl)?;
            return Message::encode(
                &ControlResponse::HeldSnapshot { counts, hold },
                vec![Bytes::from(bytes)],
            );
        }
        let changes = envelope.request.changes_state();
        let resp = match (envelope.once, envelope.request) {
            (None, request) => self.dispatch(request, body).await?,
            (Some(id), ControlRequest::GetMeta { req: r }) => {
                ControlResponse::Meta(self.plane.get_meta_once(r, id).await?)
            }
            (Some(id), ControlRequest::Notify { notice: n }) => {
                ControlResponse::Replaced(self.plane.notify_once(n, id).await?)
            }
            (Some(_), other) => {
                self.plane.meter().rejected(op.index());
                return Err(Error::invalid(format!(
                    "a request id is honoured on get_meta and production notices only, not on {}",
                    other.op().name()
                )));
            }
        };
        if let (true, Some(state)) = (changes, &self.state_dir) {
            state.changed().await?;
        }
        Message::encode(&resp, Vec::new())
    }
}

#[cfg(test)]
mod metering_tests;
mod registry;
mod remote;
#[cfg(test)]
mod wire_pin;
pub use registry::{REGISTRATION_LAPSE, UNIT_ID_HELD};
pub use remote::{Registration, RemoteControlPlane};
