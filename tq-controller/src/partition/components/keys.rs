//! The KV API's key table: key → slot, and slot → key so that a released slot drops its key.
//!
//! Invariants: `keys` and `slot_key` are inverses; `slot_key` has one entry per slot of the
//! slot table (grown with it); a key names a live slot (the release of a slot unbinds it).

use std::collections::HashMap;

/// Keys of one partition.
#[derive(Debug, Default)]
pub(in crate::partition) struct KeyTable {
    keys: HashMap<String, u32>,
    slot_key: Vec<Option<String>>,
}

impl KeyTable {
    /// The table's parts as a record holds them (see `record.rs`).
    pub fn parts(&self) -> (&HashMap<String, u32>, &Vec<Option<String>>) {
        (&self.keys, &self.slot_key)
    }

    pub fn from_parts(keys: HashMap<String, u32>, slot_key: Vec<Option<String>>) -> Self {
        KeyTable { keys, slot_key }
    }

    /// What is wrong with a restored table over `slots` slots, if anything.
    pub fn check(&self, slots: usize) -> Option<String> {
        if self.slot_key.len() != slots {
            return Some(format!(
                "{} key slots for {slots} slots",
                self.slot_key.len()
            ));
        }
        if self.keys.values().any(|&s| s as usize >= slots) {
            return Some("a key names a slot it does not have".into());
        }
        None
    }

    /// Gives the table a row for each of `slots` slots (after the slot table grew).
    pub fn grow_to(&mut self, slots: usize) {
        if self.slot_key.len() < slots {
            self.slot_key.resize(slots, None);
        }
    }

    pub fn get(&self, key: &str) -> Option<u32> {
        self.keys.get(key).copied()
    }

    /// Makes room for `count` more keys at once (see `SlotTable::reserve`).
    pub fn reserve(&mut self, count: usize) {
        self.keys.reserve(count);
    }

    pub fn bind(&mut self, key: &str, slot: u32) {
        self.keys.insert(key.to_string(), slot);
        self.slot_key[slot as usize] = Some(key.to_string());
    }

    /// Drops the key of `slot`, if it has one.
    pub fn unbind_slot(&mut self, slot: u32) {
        if let Some(k) = self.slot_key[slot as usize].take() {
            self.keys.remove(&k);
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, u32)> {
        self.keys.iter().map(|(k, &s)| (k, s))
    }
}
