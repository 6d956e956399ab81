//! A growable bitmap indexed by slot. One per field (production), per task (consumption) and
//! for row states, so that readiness scans run a word (64 slots) at a time.

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Bitmap {
    words: Vec<u64>,
}

impl Bitmap {
    pub fn get(&self, i: usize) -> bool {
        self.words
            .get(i / 64)
            .is_some_and(|w| w & (1u64 << (i % 64)) != 0)
    }

    pub fn set(&mut self, i: usize, value: bool) {
        let w = i / 64;
        if w >= self.words.len() {
            if !value {
                return;
            }
            self.words.resize(w + 1, 0);
        }
        if value {
            self.words[w] |= 1u64 << (i % 64);
        } else {
            self.words[w] &= !(1u64 << (i % 64));
        }
    }

    pub fn clear_all(&mut self) {
        self.words.clear();
    }

    pub fn count_ones(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Word `i`, zero beyond the end.
    pub fn word(&self, i: usize) -> u64 {
        self.words.get(i).copied().unwrap_or(0)
    }

    pub fn num_words(&self) -> usize {
        self.words.len()
    }

    /// Positions of set bits, ascending.
    pub fn ones(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(wi, &w)| BitIter {
            word: w,
            base: wi * 64,
        })
    }
}

/// Iterates the set bits of one word.
pub(crate) struct BitIter {
    pub word: u64,
    pub base: usize,
}

impl Iterator for BitIter {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        if self.word == 0 {
            return None;
        }
        let tz = self.word.trailing_zeros() as usize;
        self.word &= self.word - 1;
        Some(self.base + tz)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_grow() {
        let mut b = Bitmap::default();
        assert!(!b.get(1000));
        b.set(3, true);
        b.set(130, true);
        b.set(5000, false);
        assert_eq!(b.num_words(), 3);
        assert!(b.get(3) && b.get(130) && !b.get(4));
        assert_eq!(b.ones().collect::<Vec<_>>(), vec![3, 130]);
        b.set(3, false);
        assert_eq!(b.count_ones(), 1);
    }
}
