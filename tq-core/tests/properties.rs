//! Property tests of the metadata algebra and of column packing: concatenating, selecting,
//! chunking and merging metadata keep row counts, shapes and kinds consistent (ragged exactly
//! when rows differ), and packing values of every dtype and shape (zero-size included) into a
//! column gives every value back.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
use proptest::prelude::*;
use tq_core::{BatchMeta, Bytes, Column, DType, FieldKind, FieldMeta, SampleId, Tensor, Value};

fn dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(vec![
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::Bf16,
        DType::F32,
        DType::F64,
    ])
}

/// A tensor of `dtype` and `shape` with arbitrary bytes (booleans kept 0/1).
fn tensor(dtype: DType, shape: Vec<usize>, seed: u8) -> Tensor {
    let n: usize = shape.iter().product::<usize>() * dtype.size();
    let bytes: Vec<u8> = (0..n)
        .map(|i| {
            let b = (i as u8).wrapping_mul(31).wrapping_add(seed);
            if dtype == DType::Bool {
                b & 1
            } else {
                b
            }
        })
        .collect();
    Tensor::new(dtype, shape, Bytes::from(bytes)).unwrap()
}

/// A batch meta of `n` samples with one field of the given row shapes.
fn meta_of(first: u32, rows: &[Vec<usize>]) -> BatchMeta {
    let samples: Vec<SampleId> = (0..rows.len() as u32)
        .map(|i| SampleId::new(first + i, 0))
        .collect();
    BatchMeta::new("p", samples)
        .with_fields(
            [(
                "f".to_string(),
                FieldMeta::from_shapes(DType::F32, rows.to_vec()),
            )]
            .into(),
        )
        .unwrap()
}

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

    #[test]
    fn chunks_are_balanced_and_concat_back_to_the_whole(rows in shapes(), n in 1usize..8) {
        let meta = meta_of(0, &rows);
        let parts = meta.chunk(n).unwrap();
        prop_assert_eq!(parts.len(), n);
        let sizes: Vec<usize> = parts.iter().map(BatchMeta::len).collect();
        let (lo, hi) = (*sizes.iter().min().unwrap(), *sizes.iter().max().unwrap());
        prop_assert!(hi - lo <= 1, "{:?}", sizes);
        let back = BatchMeta::concat(&parts).unwrap();
        prop_assert_eq!(back.samples(), meta.samples());
        for (i, r) in rows.iter().enumerate() {
            prop_assert_eq!(back.fields()["f"].row_shape(i), Some(r.as_slice()));
        }
        prop_assert!(meta.chunk(0).is_err());
    }

    #[test]
    fn concat_promotes_to_ragged_exactly_when_shapes_differ(a in proptest::collection::vec(1usize..4, 0..3), b in proptest::collection::vec(1usize..4, 0..3), n in 1usize..4, m in 1usize..4) {
        let left = meta_of(0, &vec![a.clone(); n]);
        let right = meta_of(100, &vec![b.clone(); m]);
        let both = BatchMeta::concat(&[left, right]).unwrap();
        let kind = both.fields()["f"].kind();
        prop_assert_eq!(kind == FieldKind::Dense, a == b);
        prop_assert_eq!(both.fields()["f"].row_shape(n + m - 1), Some(b.as_slice()));
        prop_assert_eq!(both.fields()["f"].row_shape(0), Some(a.as_slice()));
    }

    #[test]
    fn union_merges_fields_of_the_same_samples_and_the_other_wins(rows in shapes(), other in shapes()) {
        let meta = meta_of(0, &rows);
        let samples = meta.samples().to_vec();
        let len = rows.len();
        let other_rows: Vec<Vec<usize>> = other.iter().cycle().take(len).cloned().collect();
        let extra = BatchMeta::new("p", samples.clone())
            .with_fields([
                ("g".to_string(), FieldMeta::from_shapes(DType::I32, other_rows.clone())),
                ("f".to_string(), FieldMeta::from_shapes(DType::I64, other_rows.clone())),
            ].into())
            .unwrap();
        let u = meta.union(&extra).unwrap();
        prop_assert_eq!(u.samples(), samples.as_slice());
        prop_assert_eq!(u.fields().len(), 2);
        prop_assert_eq!(u.fields()["f"].dtype(), Some(DType::I64), "the other side wins");
        for (i, r) in other_rows.iter().enumerate() {
            prop_assert_eq!(u.fields()["g"].row_shape(i), Some(r.as_slice()));
        }
        // Other samples (or another order) cannot be merged.
        let mut reversed = samples.clone();
        reversed.reverse();
        if reversed != samples {
            let moved = BatchMeta::new("p", reversed).with_fields(extra.fields().clone()).unwrap();
            prop_assert!(meta.union(&moved).is_err());
        }
    }

    #[test]
    fn packed_columns_give_every_value_back(
        dtype in dtype(),
        shapes in proptest::collection::vec(proptest::collection::vec(0usize..3, 0..3), 0..6),
        same in any::<bool>(),
    ) {
        // Zero-size dimensions and zero rows included; `same` gives every row the first shape.
        let shapes: Vec<Vec<usize>> = if same && !shapes.is_empty() {
            vec![shapes[0].clone(); shapes.len()]
        } else {
            shapes
        };
        let values: Vec<Value> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| Value::Tensor(tensor(dtype, s.clone(), i as u8)))
            .collect();
        if values.is_empty() {
            // Nothing to infer a dtype from: a clear error, not an empty column of a guess.
            let e = Column::from_values("f", values).unwrap_err();
            prop_assert_eq!(e.kind(), &tq_core::ErrorKind::Invalid);
            return Ok(());
        }
        let column = Column::from_values("f", values.clone()).unwrap();
        prop_assert_eq!(column.len(), values.len());
        let uniform = shapes.windows(2).all(|w| w[0] == w[1]);
        prop_assert_eq!(matches!(column, Column::Dense(_)), uniform);
        for (i, v) in values.iter().enumerate() {
            prop_assert_eq!(&column.value(i), v);
        }
        let objects: Vec<Value> = shapes
            .iter()
            .map(|s| Value::Object(Bytes::from(vec![7u8; s.len()])))
            .collect();
        let column = Column::from_values("o", objects.clone()).unwrap();
        for (i, v) in objects.iter().enumerate() {
            prop_assert_eq!(&column.value(i), v);
        }
    }
}
