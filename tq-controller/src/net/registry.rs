//! The storage units registered with a controller: one live holder per unit id.
//!
//! A unit process registers under its id with an `instance` number drawn when it starts, and
//! registers again every 500 ms. The registry keeps, per id, the instance holding it, when it
//! last registered and its *registration*: a number that grows each time another instance
//! takes the id. Clients learn it with the topology and send it with every unit request; a read
//! by a client that routes to an earlier registration, of cells the unit does not hold, is
//! answered `DataLost` naming the replacement (the cells went with the old process) instead of
//! `NotFound`.
//!
//! Rules:
//! - the same instance registering again: refreshed (endpoint updated if it moved);
//! - another instance while the holder registered within [`REGISTRATION_LAPSE`]: refused with
//!   `Conflict`, naming the holder's endpoint, and logged as a warning — two processes under
//!   one id would split its samples between them;
//! - another instance after the holder lapsed (it died), or at the holder's own endpoint (it
//!   could bind it, so the holder no longer serves there: a restart): accepted as a
//!   replacement under the next registration;
//! - units in the controller's own process (`tq serve`) are registered once and never lapse.
//!
//! A controller restarted on its state dir starts with an empty registry: a unit that rejoins
//! brings the registration it holds, which the registry takes as it is.

use super::{Topology, UnitInfo};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tq_core::{Error, Result};

/// A unit that has not registered for this long has lapsed: another process may take its id.
/// Four registration periods, so a unit that misses a few (a busy machine) keeps its id.
pub const REGISTRATION_LAPSE: Duration = Duration::from_secs(2);

/// Words in the `Conflict` refusing a second process under a live unit's id, for a starting
/// unit that waits for a dead predecessor's registration to lapse.
pub const UNIT_ID_HELD: &str = "is held by a live unit";

/// When a unit last registered; `None` for a unit in the controller's process (never lapses).
type LastSeen = Option<Instant>;

pub(super) struct Registry {
    pub(super) topology: Topology,
    seen: HashMap<String, LastSeen>,
}

impl Registry {
    pub(super) fn new(topology: Topology) -> Self {
        Registry {
            topology,
            seen: HashMap::new(),
        }
    }

    /// Registers `info` (see the module documentation); `remote` for a unit that registers over
    /// the network (and must keep doing so). Returns the registration the unit holds now.
    pub(super) fn register(
        &mut self,
        mut info: UnitInfo,
        remote: bool,
        now: Instant,
    ) -> Result<u64> {
        let t = &mut self.topology;
        if let Some(known) = t.units.iter_mut().find(|u| u.id == info.id) {
            let seen = self.seen.get(&info.id).copied().flatten();
            if known.instance == info.instance {
                if known.endpoint != info.endpoint {
                    tracing::info!(unit = %info.id, endpoint = %info.endpoint, "storage unit moved");
                    known.endpoint = info.endpoint;
                }
                // A unit that rejoins a restarted controller brings its registration.
                known.registration = known.registration.max(info.registration);
                self.seen.insert(info.id, remote.then_some(now));
                return Ok(known.registration);
            }
            // A new process that serves at the holder's endpoint could bind it: the holder no
            // longer serves there (it died and this is its restart), so it need not lapse.
            let alive = known.endpoint != info.endpoint
                && match seen {
                    None => true,
                    Some(at) => now.saturating_duration_since(at) < REGISTRATION_LAPSE,
                };
            if alive {
                let ago = seen.map_or_else(
                    || "it runs in the controller's process".to_string(),
                    |at| {
                        format!(
                            "it registered {} ms ago",
                            now.saturating_duration_since(at).as_millis()
                        )
                    },
                );
                tracing::warn!(
                    unit = %info.id,
                    holder = %known.endpoint,
                    refused = %info.endpoint,
                    "refused a second storage unit under an id a live unit holds"
                );
                return Err(Error::conflict(format!(
                    "storage unit id `{}` {UNIT_ID_HELD} at {} ({ago}); a second unit \
                     under the same id would split its samples between two processes. Give \
                     this one another --id, or stop the holder: its id is free {} ms after its \
                     last registration",
                    info.id,
                    known.endpoint,
                    REGISTRATION_LAPSE.as_millis()
                )));
            }
            let registration = known.registration.max(info.registration) + 1;
            tracing::warn!(
                unit = %info.id,
                old = %known.endpoint,
                new = %info.endpoint,
                registration,
                "storage unit replaced (the holder stopped registering): its cells are gone, \
                 and requests made for the old holder are refused"
            );
            info.registration = registration;
            *known = info;
            self.seen.insert(known.id.clone(), remote.then_some(now));
            return Ok(registration);
        }
        if t.storage.is_some() {
            return Err(Error::conflict(format!(
                "storage unit `{}` refused: this controller's storage is shared (a KV store), \
                 it runs no storage units",
                info.id
            )));
        }
        if t.is_complete() {
            return Err(Error::conflict(format!(
                "all {} storage units are registered; unknown unit `{}` refused",
                t.expected_units, info.id
            )));
        }
        tracing::info!(unit = %info.id, endpoint = %info.endpoint, "storage unit registered");
        info.registration = info.registration.max(1);
        let registration = info.registration;
        self.seen.insert(info.id.clone(), remote.then_some(now));
        t.units.push(info);
        // Routing order is the order of unit ids, not of registration: a restarted controller
        // that the units rejoin in another order still routes index `i` to the same unit.
        t.units.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(registration)
    }

    /// Registered units that have not registered within [`REGISTRATION_LAPSE`], with how long
    /// ago they last did (for health checks).
    pub(super) fn lapsed(&self, now: Instant) -> Vec<(String, Duration)> {
        self.topology
            .units
            .iter()
            .filter_map(|u| {
                let at = self.seen.get(&u.id).copied().flatten()?;
                let ago = now.saturating_duration_since(at);
                (ago >= REGISTRATION_LAPSE).then(|| (u.id.clone(), ago))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn unit(id: &str, endpoint: &str, instance: u64) -> UnitInfo {
        UnitInfo {
            id: id.into(),
            endpoint: endpoint.into(),
            instance,
            registration: 0,
        }
    }

    fn registry() -> Registry {
        Registry::new(Topology {
            expected_units: 2,
            units: Vec::new(),
            storage: None,
            epoch: 1,
        })
    }

    #[test]
    fn one_live_holder_per_id() {
        let mut r = registry();
        let t0 = Instant::now();
        assert_eq!(r.register(unit("u0", "tcp://a:1", 7), true, t0).unwrap(), 1);
        // The holder again: refreshed, same registration.
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(r.register(unit("u0", "tcp://a:1", 7), true, t1).unwrap(), 1);
        // Another process under the same id while the holder lives: refused, naming it.
        let e = r
            .register(
                unit("u0", "tcp://b:2", 8),
                true,
                t1 + Duration::from_millis(100),
            )
            .unwrap_err();
        assert_eq!(e.kind(), &tq_core::ErrorKind::Conflict);
        assert!(e.message().contains("tcp://a:1"), "{e}");
        assert_eq!(r.topology.units[0].endpoint, "tcp://a:1");
        assert!(r.lapsed(t1 + Duration::from_millis(100)).is_empty());
        // The holder stopped registering: it lapses, and the replacement takes the id under
        // the next registration.
        let later = t1 + REGISTRATION_LAPSE;
        assert_eq!(r.lapsed(later).len(), 1);
        assert_eq!(
            r.register(unit("u0", "tcp://b:2", 8), true, later).unwrap(),
            2
        );
        assert_eq!(r.topology.units[0].endpoint, "tcp://b:2");
        assert_eq!(r.topology.units[0].registration, 2);
        // The old holder comes back: it is the one refused now.
        let e = r
            .register(
                unit("u0", "tcp://a:1", 7),
                true,
                later + Duration::from_millis(10),
            )
            .unwrap_err();
        assert!(e.message().contains("tcp://b:2"), "{e}");
    }

    #[test]
    fn a_restart_at_the_holders_endpoint_replaces_it_at_once() {
        let mut r = registry();
        let t0 = Instant::now();
        r.register(unit("u0", "tcp://a:1", 7), true, t0).unwrap();
        let soon = t0 + Duration::from_millis(100);
        assert_eq!(
            r.register(unit("u0", "tcp://a:1", 8), true, soon).unwrap(),
            2
        );
        assert_eq!(r.topology.units[0].instance, 8);
    }

    #[test]
    fn in_process_units_never_lapse_and_rejoining_units_keep_their_registration() {
        let mut r = registry();
        let t0 = Instant::now();
        r.register(unit("u0", "tcp://a:1", 1), false, t0).unwrap();
        let much_later = t0 + Duration::from_secs(3600);
        assert!(r.lapsed(much_later).is_empty());
        assert!(r
            .register(unit("u0", "tcp://b:2", 2), true, much_later)
            .is_err());
        // A unit holding registration 5 (from before a controller restart) keeps it.
        let mut rejoin = unit("u1", "tcp://c:3", 9);
        rejoin.registration = 5;
        assert_eq!(r.register(rejoin, true, much_later).unwrap(), 5);
    }
}
