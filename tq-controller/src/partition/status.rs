//! A partition's counts for `tq stats` and the `tq_partition_*` gauges: word-wise bitmap counts,
//! no per-sample work.

use super::Partition;
use crate::api::{PartitionStatus, TaskStatus};

impl Partition {
    /// Visible samples, how many hold every field that has members, and per task what it
    /// consumed and holds leased (visible samples only, like every other query).
    pub fn status(&self) -> PartitionStatus {
        let words = self.slots.num_words();
        let visible = |w: usize| self.slots.visible_word(w);
        let fields: Vec<_> = self.fields.populated().map(|(_, f)| f).collect();
        let mut samples = 0u64;
        let mut produced = 0u64;
        for w in 0..words {
            let v = visible(w);
            samples += u64::from(v.count_ones());
            if !fields.is_empty() {
                let all = fields.iter().fold(v, |acc, f| acc & f.produced_word(w));
                produced += u64::from(all.count_ones());
            }
        }
        let mut tasks: Vec<TaskStatus> = self
            .tasks
            .iter()
            .map(|(name, t)| {
                let count = |word: &dyn Fn(usize) -> u64| -> u64 {
                    (0..words)
                        .map(|w| u64::from((visible(w) & word(w)).count_ones()))
                        .sum()
                };
                TaskStatus {
                    name: name.clone(),
                    consumed: count(&|w| t.consumed_word(w)),
                    leased: count(&|w| t.leased_word(w)),
                    leases: t.lease_count() as u64,
                }
            })
            .collect();
        tasks.sort_by(|a, b| a.name.cmp(&b.name));
        PartitionStatus {
            name: self.name.clone(),
            samples,
            produced,
            fields: fields.len() as u64,
            keys: self.keys.len() as u64,
            complete: self.complete,
            tasks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::IndexAllocator;

    #[test]
    fn an_empty_partition_counts_nothing() {
        let mut alloc = IndexAllocator::new(2);
        let mut p = Partition::new("p".into(), 2);
        let slots = p.allocate(&mut alloc, 3);
        let status = p.status();
        assert_eq!((status.samples, status.produced, status.fields), (3, 0, 0));
        assert!(status.tasks.is_empty());
        assert_eq!(slots.len(), 3);
    }
}
