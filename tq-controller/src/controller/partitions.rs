//! The controller's partitions, with a record of which ones changed: what `--state-dir` writes
//! to its log after each change instead of the whole state (see `crate::state_dir`).
//!
//! Every way to change a partition goes through a method here that marks it, so a change
//! cannot be left out of the log: reading goes through `Deref` to the map, and there is no
//! `DerefMut`. Marking on mutable access is a superset of the real changes (a request that
//! looked at a partition mutably and then failed marks it too), which costs a rewrite, never a
//! lost change.

use super::Partition;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// Partition name → partition, plus the names changed since the changes were last taken.
/// Serialises as the plain map, so snapshots keep their format.
#[derive(Default, Serialize, Deserialize)]
#[serde(transparent)]
pub(super) struct Partitions {
    map: HashMap<String, Partition>,
    #[serde(skip)]
    changed: Changed,
}

/// What changed since the changes were last taken.
#[derive(Default)]
pub(super) struct Changed {
    /// Partitions changed (possibly removed since: absent from the map).
    pub names: HashSet<String>,
    /// Everything was replaced (a restore): the next record carries every partition.
    pub all: bool,
}

impl std::ops::Deref for Partitions {
    type Target = HashMap<String, Partition>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl Partitions {
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Partition> {
        let p = self.map.get_mut(name)?;
        if !self.changed.all && !self.changed.names.contains(name) {
            self.changed.names.insert(name.to_string());
        }
        Some(p)
    }

    pub fn insert(&mut self, name: String, partition: Partition) {
        self.changed.names.insert(name.clone());
        self.map.insert(name, partition);
    }

    pub fn remove(&mut self, name: &str) -> Option<Partition> {
        let removed = self.map.remove(name)?;
        self.changed.names.insert(name.to_string());
        Some(removed)
    }

    /// Marks every partition changed (after the whole state was replaced).
    pub fn mark_all_changed(&mut self) {
        self.changed.all = true;
    }

    /// The changes since the last call, and a fresh record from now on.
    pub fn take_changed(&mut self) -> Changed {
        std::mem::take(&mut self.changed)
    }

    /// Sets a partition's state as a log record gives it (`None`: it no longer exists). Not a
    /// change to log: the record is already in the log.
    pub fn set_recovered(&mut self, name: String, partition: Option<Partition>) {
        match partition {
            Some(p) => {
                self.map.insert(name, p);
            }
            None => {
                self.map.remove(&name);
            }
        }
    }

    /// Replaces every partition with a record's (a record that carries them all).
    pub fn replace_recovered(&mut self, map: HashMap<String, Partition>) {
        self.map = map;
    }
}
