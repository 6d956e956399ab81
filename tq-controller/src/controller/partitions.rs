//! The controller's partitions, each behind its own lock, with a record of which ones changed:
//! what `--state-dir` writes to its log after each change instead of the whole state (see
//! `crate::state_dir`).
//!
//! Two ways in, matching the controller's two kinds of lock (see `Controller::shared`):
//! - holding the state *exclusively* (`&mut Partitions`): `get_mut`, `insert`, `remove`, which
//!   need no partition lock since nobody else can reach a partition;
//! - holding the state *shared*: `get` to read and `lock_mut` to change one partition, under
//!   that partition's own mutex, so requests for different partitions run side by side.
//!
//! Every way to change a partition marks it changed, so a change cannot be left out of the
//! log. Marking on mutable access is a superset of the real changes (a request that looked at
//! a partition mutably and then failed marks it too), which costs a rewrite, never a lost
//! change.

use super::Partition;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

/// One partition and whether it changed since the changes were last taken. Serialises as
/// the partition alone, so snapshots keep their format.
pub(super) struct PartitionCell {
    partition: Mutex<Partition>,
    /// Set by every mutable access, taken by `take_changed` (under the exclusive lock, which
    /// orders it after every shared-lock change).
    changed: AtomicBool,
}

impl PartitionCell {
    fn new(partition: Partition, changed: bool) -> Self {
        PartitionCell {
            partition: Mutex::new(partition),
            changed: AtomicBool::new(changed),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Partition> {
        // A panic inside a critical section is a bug; every mutation validates first, so the
        // partition is still structurally valid: keep serving.
        self.partition.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get_mut(&mut self) -> &mut Partition {
        self.partition.get_mut().unwrap_or_else(|p| p.into_inner())
    }
}

impl Serialize for PartitionCell {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.lock().serialize(s)
    }
}

impl<'de> Deserialize<'de> for PartitionCell {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Partition::deserialize(d).map(|p| PartitionCell::new(p, false))
    }
}

/// Partition name → partition, plus the names changed since the changes were last taken.
/// Serialises as the plain map, so snapshots keep their format.
#[derive(Default, Serialize, Deserialize)]
#[serde(transparent)]
pub(super) struct Partitions {
    map: HashMap<String, PartitionCell>,
    /// Partitions created or removed since the changes were last taken (the cells' flags say
    /// which of the others changed).
    #[serde(skip)]
    added_or_removed: HashSet<String>,
    /// Everything was replaced (a restore): the next record carries every partition.
    #[serde(skip)]
    all_changed: bool,
}

/// What changed since the changes were last taken.
#[derive(Default)]
pub(super) struct Changed {
    /// Partitions changed (possibly removed since: absent from the map).
    pub names: HashSet<String>,
    /// Everything was replaced (a restore): the next record carries every partition.
    pub all: bool,
}

impl Partitions {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// A partition to read, under its lock.
    pub fn get(&self, name: &str) -> Option<MutexGuard<'_, Partition>> {
        self.map.get(name).map(PartitionCell::lock)
    }

    /// A partition to change while the state is shared, under its lock; marked changed.
    pub fn lock_mut(&self, name: &str) -> Option<MutexGuard<'_, Partition>> {
        let cell = self.map.get(name)?;
        cell.changed.store(true, Ordering::Relaxed);
        Some(cell.lock())
    }

    /// A partition to change while the state is held exclusively (no lock needed); marked
    /// changed.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Partition> {
        let cell = self.map.get_mut(name)?;
        *cell.changed.get_mut() = true;
        Some(cell.get_mut())
    }

    /// Every partition, read under its lock one after the other.
    pub fn iter(&self) -> impl Iterator<Item = (&String, MutexGuard<'_, Partition>)> {
        self.map.iter().map(|(name, cell)| (name, cell.lock()))
    }

    /// Every partition by name, read while the state is held exclusively (no locks taken).
    pub fn exclusive_view(&mut self) -> HashMap<&str, &Partition> {
        self.map
            .iter_mut()
            .map(|(name, cell)| (name.as_str(), &*cell.get_mut()))
            .collect()
    }

    pub fn insert(&mut self, name: String, partition: Partition) {
        self.added_or_removed.insert(name.clone());
        self.map.insert(name, PartitionCell::new(partition, true));
    }

    pub fn remove(&mut self, name: &str) -> Option<Partition> {
        let removed = self.map.remove(name)?;
        self.added_or_removed.insert(name.to_string());
        Some(
            removed
                .partition
                .into_inner()
                .unwrap_or_else(|p| p.into_inner()),
        )
    }

    /// Marks every partition changed (after the whole state was replaced).
    pub fn mark_all_changed(&mut self) {
        self.all_changed = true;
    }

    /// The changes since the last call, and a fresh record from now on. Costs a flag per
    /// partition.
    pub fn take_changed(&mut self) -> Changed {
        let mut names = std::mem::take(&mut self.added_or_removed);
        for (name, cell) in &mut self.map {
            if std::mem::take(cell.changed.get_mut()) {
                names.insert(name.clone());
            }
        }
        Changed {
            names,
            all: std::mem::take(&mut self.all_changed),
        }
    }

    /// Sets a partition's state as a log record gives it (`None`: it no longer exists). Not a
    /// change to log: the record is already in the log.
    pub fn set_recovered(&mut self, name: String, partition: Option<Partition>) {
        match partition {
            Some(p) => {
                self.map.insert(name, PartitionCell::new(p, false));
            }
            None => {
                self.map.remove(&name);
            }
        }
    }

    /// Replaces every partition with a record's (a record that carries them all).
    pub fn replace_recovered(&mut self, map: HashMap<String, Partition>) {
        self.map = map
            .into_iter()
            .map(|(name, p)| (name, PartitionCell::new(p, false)))
            .collect();
    }
}
