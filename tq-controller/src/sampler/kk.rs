//! Karmarkar–Karp largest differencing for `k` parts, used to balance load across DP ranks.
//!
//! Every item starts as a partial solution ("state") of `k` sets. The two states with the largest
//! spread (heaviest set minus lightest set) are merged by pairing the heaviest set of one with the
//! lightest set of the other, the second heaviest with the second lightest, and so on, until one
//! state is left. The equal-size variant seeds each state with `k` items (one per set) taken in
//! weight order, so every final set has the same number of items.
//!
//! Deterministic: ties are broken by item index (callers number items in allocation order).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Debug)]
struct Set {
    sum: f64,
    /// Smallest item index, `usize::MAX` when empty.
    first: usize,
    items: Vec<usize>,
}

impl Set {
    fn empty() -> Self {
        Set {
            sum: 0.0,
            first: usize::MAX,
            items: Vec::new(),
        }
    }

    fn one(item: usize, weight: f64) -> Self {
        Set {
            sum: weight,
            first: item,
            items: vec![item],
        }
    }

    fn absorb(&mut self, mut other: Set) {
        self.sum += other.sum;
        self.first = self.first.min(other.first);
        if self.items.len() < other.items.len() {
            std::mem::swap(&mut self.items, &mut other.items);
        }
        self.items.extend(other.items);
    }

    /// Heaviest first; among equal sums the one with more items (so an empty set is never
    /// preferred over a set of zero-weight items), then the one with the older first item.
    fn heaviest_first(a: &Set, b: &Set) -> Ordering {
        b.sum
            .total_cmp(&a.sum)
            .then(b.items.len().cmp(&a.items.len()))
            .then(a.first.cmp(&b.first))
    }
}

/// A partial solution: `k` sets, heaviest first.
#[derive(Debug)]
struct State {
    sets: Vec<Set>,
    /// Smallest item index in the state (unique among disjoint states): the tie-breaker.
    first: usize,
}

impl State {
    fn new(mut sets: Vec<Set>) -> Self {
        sets.sort_by(Set::heaviest_first);
        let first = sets.iter().map(|s| s.first).min().unwrap_or(usize::MAX);
        State { sets, first }
    }

    fn spread(&self) -> f64 {
        self.sets[0].sum - self.sets[self.sets.len() - 1].sum
    }

    /// Pairs set `i` of `self` with set `k-1-i` of `other` (heaviest with lightest).
    fn merge(self, other: State) -> State {
        let sets = self
            .sets
            .into_iter()
            .zip(other.sets.into_iter().rev())
            .map(|(mut a, b)| {
                a.absorb(b);
                a
            })
            .collect();
        State::new(sets)
    }
}

/// Heap entry: the largest spread first, then the state with the older first item.
struct BySpread {
    spread: f64,
    state: State,
}

impl BySpread {
    fn new(state: State) -> Self {
        BySpread {
            spread: state.spread(),
            state,
        }
    }
}

impl Ord for BySpread {
    fn cmp(&self, other: &Self) -> Ordering {
        self.spread
            .total_cmp(&other.spread)
            .then(other.state.first.cmp(&self.state.first))
    }
}

impl PartialOrd for BySpread {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for BySpread {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for BySpread {}

/// Splits items `0..weights.len()` into `k` parts of balanced total weight.
///
/// With `equal_size` (which needs `weights.len()` to be a multiple of `k`; otherwise it is
/// ignored) every part gets the same number of items. Each part lists its items in ascending
/// order; parts are ordered by their smallest item, empty parts last. With at least `k` items no
/// part is empty. Weights must be finite.
pub(crate) fn karmarkar_karp(weights: &[f64], k: usize, equal_size: bool) -> Vec<Vec<usize>> {
    assert!(k >= 1, "karmarkar_karp needs k >= 1");
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| weights[a].total_cmp(&weights[b]).then(a.cmp(&b)));

    let mut heap = BinaryHeap::with_capacity(weights.len());
    if equal_size && weights.len().is_multiple_of(k) {
        for chunk in order.chunks(k) {
            let sets = chunk.iter().map(|&i| Set::one(i, weights[i])).collect();
            heap.push(BySpread::new(State::new(sets)));
        }
    } else {
        for &i in &order {
            let mut sets = Vec::with_capacity(k);
            sets.push(Set::one(i, weights[i]));
            sets.resize_with(k, Set::empty);
            heap.push(BySpread::new(State::new(sets)));
        }
    }

    while heap.len() > 1 {
        let (Some(a), Some(b)) = (heap.pop(), heap.pop()) else {
            break;
        };
        heap.push(BySpread::new(a.state.merge(b.state)));
    }

    let mut sets = match heap.pop() {
        Some(s) => s.state.sets,
        None => (0..k).map(|_| Set::empty()).collect(),
    };
    sets.sort_by_key(|s| s.first);
    sets.into_iter()
        .map(|s| {
            let mut items = s.items;
            items.sort_unstable();
            items
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sums(weights: &[f64], parts: &[Vec<usize>]) -> Vec<f64> {
        parts
            .iter()
            .map(|p| p.iter().map(|&i| weights[i]).sum())
            .collect()
    }

    fn assert_cover(n: usize, parts: &[Vec<usize>]) {
        let mut all: Vec<usize> = parts.concat();
        all.sort_unstable();
        assert_eq!(all, (0..n).collect::<Vec<_>>(), "{parts:?}");
    }

    #[test]
    fn balances_the_reference_example() {
        let w = [100.0, 100.0, 10.0, 10.0];
        for equal in [true, false] {
            let parts = karmarkar_karp(&w, 2, equal);
            assert_cover(4, &parts);
            assert_eq!(sums(&w, &parts), vec![110.0, 110.0], "equal_size {equal}");
        }
    }

    #[test]
    fn equal_size_gives_equal_counts() {
        let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0];
        let parts = karmarkar_karp(&w, 3, true);
        assert_cover(9, &parts);
        assert!(parts.iter().all(|p| p.len() == 3), "{parts:?}");
        // A contiguous split would give 6/15/24; KK is a heuristic but gets within 2.
        let s = sums(&w, &parts);
        let spread =
            s.iter().cloned().fold(f64::MIN, f64::max) - s.iter().cloned().fold(f64::MAX, f64::min);
        assert!(spread <= 2.0, "{s:?}");
        // Without equal sizes a heavy item may stand alone.
        let w = [50.0, 10.0, 20.0, 20.0];
        let parts = karmarkar_karp(&w, 2, false);
        assert_cover(4, &parts);
        assert_eq!(parts, vec![vec![0], vec![1, 2, 3]]);
    }

    #[test]
    fn no_empty_part_with_enough_items_even_with_zero_weights() {
        let w = [0.0, 0.0, 0.0, 7.0];
        let parts = karmarkar_karp(&w, 3, false);
        assert_cover(4, &parts);
        assert!(parts.iter().all(|p| !p.is_empty()), "{parts:?}");
        // Fewer items than parts: the empty parts come last.
        let parts = karmarkar_karp(&[3.0], 2, false);
        assert_eq!(parts, vec![vec![0], vec![]]);
        assert_eq!(karmarkar_karp(&[], 2, true), vec![Vec::<usize>::new(); 2]);
    }

    #[test]
    fn ties_are_broken_by_item_order() {
        let w = [1.0; 4];
        let parts = karmarkar_karp(&w, 2, true);
        assert_eq!(parts, vec![vec![0, 3], vec![1, 2]]);
        assert_eq!(karmarkar_karp(&w, 2, true), parts);
    }
}
