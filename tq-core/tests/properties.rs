//! Property tests of the metadata algebra: concatenating and selecting rows of a field's
//! metadata, and BatchMeta's selections, keep row counts, shapes and kinds consistent.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
use proptest::prelude::*;
use tq_core::{BatchMeta, DType, FieldKind, FieldMeta, SampleId};

fn shapes() -> impl Strategy<Value = Vec<Vec<usize>>> {
    proptest::collection::vec(proptest::collection::vec(1usize..4, 0..3), 1..12)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn from_shapes_is_dense_exactly_when_all_rows_agree(rows in shapes()) {
        let m = FieldMeta::from_shapes(DType::F32, rows.clone());
        let uniform = rows.iter().all(|r| r == &rows[0]);
        prop_assert_eq!(m.kind() == FieldKind::Dense, uniform);
        for (i, r) in rows.iter().enumerate() {
            prop_assert_eq!(m.row_shape(i), Some(r.as_slice()));
        }
    }

    #[test]
    fn concat_keeps_every_row_shape_in_order(parts in proptest::collection::vec(shapes(), 1..4)) {
        let metas: Vec<FieldMeta> = parts.iter().map(|p| FieldMeta::from_shapes(DType::I64, p.clone())).collect();
        let pairs: Vec<(&FieldMeta, usize)> = metas.iter().zip(&parts).map(|(m, p)| (m, p.len())).collect();
        let all = FieldMeta::concat("f", &pairs).unwrap();
        let flat: Vec<Vec<usize>> = parts.concat();
        for (i, r) in flat.iter().enumerate() {
            prop_assert_eq!(all.row_shape(i), Some(r.as_slice()));
        }
        prop_assert_eq!(all.dtype(), Some(DType::I64));
    }

    #[test]
    fn selecting_rows_picks_their_shapes(rows in shapes(), picks in proptest::collection::vec(any::<prop::sample::Index>(), 0..10)) {
        let m = FieldMeta::from_shapes(DType::U8, rows.clone());
        let positions: Vec<usize> = picks.iter().map(|i| i.index(rows.len())).collect();
        let sel = m.select_rows("f", &positions).unwrap();
        for (j, &p) in positions.iter().enumerate() {
            prop_assert_eq!(sel.row_shape(j), Some(rows[p].as_slice()));
        }
        // A position past the rows is an error for a ragged field, never a panic.
        let _ = m.select_rows("f", &[rows.len()]);
    }

    #[test]
    fn batch_meta_sample_selection_keeps_rows_aligned(n in 1usize..20, picks in proptest::collection::vec(any::<prop::sample::Index>(), 0..20)) {
        let samples: Vec<SampleId> = (0..n as u32).map(|i| SampleId::new(i * 3, i)).collect();
        let shapes: Vec<Vec<usize>> = (0..n).map(|i| vec![i % 3 + 1]).collect();
        let meta = BatchMeta::new("p", samples.clone())
            .with_fields([("f".to_string(), FieldMeta::from_shapes(DType::F32, shapes.clone()))].into())
            .unwrap();
        let positions: Vec<usize> = picks.iter().map(|i| i.index(n)).collect();
        let sel = meta.select_samples(&positions).unwrap();
        prop_assert_eq!(sel.len(), positions.len());
        for (j, &p) in positions.iter().enumerate() {
            prop_assert_eq!(sel.samples()[j], samples[p]);
            prop_assert_eq!(sel.fields()["f"].row_shape(j), Some(shapes[p].as_slice()));
        }
        prop_assert!(meta.select_samples(&[n]).is_err());
    }
}
