//! The destination side of `kv_link`: per slot, which fields read a public sample's cell, and
//! which public samples were ever linked (their payloads are protected from sweeps until then).
//!
//! Invariants: no slot has an empty link map; a released slot has no links and is not marked.

use crate::bitmap::Bitmap;
use std::collections::{BTreeMap, HashMap};
use tq_core::SampleId;

/// Links of one partition.
#[derive(Debug, Default)]
pub(in crate::partition) struct LinkTable {
    /// Per slot, field id → the public sample it reads.
    links: HashMap<u32, BTreeMap<usize, SampleId>>,
    /// Public samples that were linked at least once (protects fresh payloads from sweeps).
    ever_linked: Bitmap,
}

impl LinkTable {
    /// The table's parts as a record holds them (see `record.rs`).
    pub fn parts(&self) -> (&HashMap<u32, BTreeMap<usize, SampleId>>, &Bitmap) {
        (&self.links, &self.ever_linked)
    }

    pub fn from_parts(links: HashMap<u32, BTreeMap<usize, SampleId>>, ever_linked: Bitmap) -> Self {
        LinkTable { links, ever_linked }
    }

    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// The public sample field `f` of `slot` reads, if it is a link.
    pub fn get(&self, slot: u32, f: usize) -> Option<SampleId> {
        self.links.get(&slot).and_then(|l| l.get(&f)).copied()
    }

    /// The links of `slot`, by field id.
    pub fn of_slot(&self, slot: u32) -> Option<&BTreeMap<usize, SampleId>> {
        self.links.get(&slot)
    }

    pub fn insert(&mut self, slot: u32, f: usize, source: SampleId) {
        self.links.entry(slot).or_default().insert(f, source);
    }

    /// Drops the link of field `f` of `slot`; returns the source it read.
    pub fn remove(&mut self, slot: u32, f: usize) -> Option<SampleId> {
        let links = self.links.get_mut(&slot)?;
        let src = links.remove(&f)?;
        if links.is_empty() {
            self.links.remove(&slot);
        }
        Some(src)
    }

    /// Takes every link of `slot` and its mark (its sample is released).
    pub fn take_slot(&mut self, slot: u32) -> Option<BTreeMap<usize, SampleId>> {
        self.ever_linked.set(slot as usize, false);
        self.links.remove(&slot)
    }

    pub fn mark_ever_linked(&mut self, slot: u32) {
        self.ever_linked.set(slot as usize, true);
    }

    pub fn ever_linked(&self, slot: u32) -> bool {
        self.ever_linked.get(slot as usize)
    }
}
