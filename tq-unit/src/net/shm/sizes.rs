//! Which gets are too small for the shared-memory channel: a stub remembers how large each
//! field's cells were when it last put or got them.
//!
//! Why: the channel's exchange (a Unix-socket message with descriptors, a mapping per segment)
//! costs about 0.1 ms more than a pooled TCP request, which a one-sample get of 4 KiB pays in
//! full (tq.compat's round trip under Ray: 0.70–0.77 ms with the channel, 0.59–0.65 over TCP).
//! A get request names fields and samples, not bytes, and counting cells alone sent gets of a
//! few large rows back to TCP; the size a field's cells had is what tells them apart. A guess
//! that is wrong (a ragged field whose rows grew) only picks the slower path: both answer the
//! same cells.

use crate::{Fetched, UnitRows};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use tq_core::FieldName;

/// Gets whose cells are known to total less than this go over TCP.
pub(crate) const MIN_SHARED_GET: usize = super::MIN_SHARED_PUT;

/// Largest cell seen per field, in bytes.
#[derive(Debug, Default)]
pub(crate) struct CellSizes {
    largest: Mutex<HashMap<FieldName, usize>>,
}

impl CellSizes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<FieldName, usize>> {
        // Only plain inserts run under the lock; a poisoned map is still a valid map.
        self.largest.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers the largest cell of each field of a put or a get (`cells` per field).
    pub(crate) fn learn<'a>(&self, cells: impl IntoIterator<Item = (&'a FieldName, usize)>) {
        let mut largest = self.lock();
        for (field, bytes) in cells {
            match largest.get_mut(field) {
                Some(known) => *known = bytes,
                None => {
                    largest.insert(field.clone(), bytes);
                }
            }
        }
    }

    /// [`Self::learn`] from a put's rows, in the same pass that sizes it: returns the put's
    /// payload bytes (which decide whether it takes a segment).
    pub(crate) fn learn_put(&self, fields: &BTreeMap<FieldName, UnitRows>) -> usize {
        let mut total = 0usize;
        self.learn(fields.iter().filter_map(|(f, rows)| {
            let mut largest = None;
            for v in &rows.values {
                let n = v.bytes().len();
                total += n;
                largest = largest.max(Some(n));
            }
            Some((f, largest?))
        }));
        total
    }

    /// [`Self::learn`] from a get's answer, column by column (an empty one tells nothing).
    pub(crate) fn learn_got(&self, fields: &[FieldName], columns: &[Vec<Fetched>]) {
        self.learn(
            fields
                .iter()
                .zip(columns)
                .filter_map(|(f, column)| Some((f, column.iter().map(fetched_len).max()?))),
        );
    }

    /// Whether a get of `fields` for `rows` samples is known to move less than
    /// [`MIN_SHARED_GET`]: every field seen before, and the sizes last seen add up below it.
    pub(crate) fn is_small_get(&self, fields: &[FieldName], rows: usize) -> bool {
        let largest = self.lock();
        let mut total = 0usize;
        for f in fields {
            let Some(&bytes) = largest.get(f) else {
                return false;
            };
            total = total.saturating_add(bytes.saturating_mul(rows));
        }
        total < MIN_SHARED_GET
    }
}

fn fetched_len(cell: &Fetched) -> usize {
    match cell {
        Fetched::Value(v) => v.bytes().len(),
        Fetched::Placed { bytes, .. } => bytes.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use tq_core::Value;

    fn object(len: usize) -> Fetched {
        Fetched::Value(Value::Object(Bytes::from(vec![0u8; len])))
    }

    #[test]
    fn a_get_is_small_only_when_every_field_is_known_and_the_sum_is_under_the_bound() {
        let sizes = CellSizes::default();
        let (x, y) = ("x".to_string(), "y".to_string());
        assert!(
            !sizes.is_small_get(std::slice::from_ref(&x), 1),
            "unknown field"
        );
        sizes.learn([(&x, 4096)]);
        assert!(sizes.is_small_get(std::slice::from_ref(&x), 1));
        assert!(sizes.is_small_get(std::slice::from_ref(&x), 63));
        assert!(
            !sizes.is_small_get(std::slice::from_ref(&x), 64),
            "64 × 4 KiB is 256 KiB"
        );
        assert!(!sizes.is_small_get(&[x.clone(), y.clone()], 1), "y unknown");
        sizes.learn_got(
            &[x.clone(), y.clone()],
            &[vec![object(8), object(16)], vec![object(1 << 20)]],
        );
        assert!(
            sizes.is_small_get(std::slice::from_ref(&x), 1000),
            "x now 16 B"
        );
        assert!(!sizes.is_small_get(&[x, y.clone()], 1), "y is 1 MiB");
        sizes.learn_got(std::slice::from_ref(&y), &[vec![]]);
        assert!(
            !sizes.is_small_get(&[y], 1),
            "an empty answer says nothing of y"
        );
    }
}
