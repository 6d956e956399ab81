//! Property tests of the KV value format: any value encodes and decodes back exactly, and any
//! bytes read from a store decode to a value or a `Corrupted` error naming the key — never a
//! panic.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
use bytes::Bytes;
use proptest::prelude::*;
use tq_backend_kv::codec::{decode_value, encode_header};
use tq_core::{DType, ErrorKind, Tensor, Value};

fn dtype() -> impl Strategy<Value = DType> {
    prop_oneof![
        Just(DType::Bool),
        Just(DType::U8),
        Just(DType::I8),
        Just(DType::I16),
        Just(DType::I32),
        Just(DType::I64),
        Just(DType::U16),
        Just(DType::U32),
        Just(DType::U64),
        Just(DType::F16),
        Just(DType::Bf16),
        Just(DType::F32),
        Just(DType::F64),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    let tensor =
        (dtype(), proptest::collection::vec(0usize..5, 0..4)).prop_flat_map(|(d, shape)| {
            let len = shape.iter().product::<usize>() * d.size();
            proptest::collection::vec(any::<u8>(), len..=len).prop_map(move |data| {
                Value::Tensor(Tensor::new(d, shape.clone(), Bytes::from(data)).unwrap())
            })
        });
    let object =
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(|b| Value::Object(Bytes::from(b)));
    prop_oneof![tensor, object]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn values_round_trip(v in value()) {
        let mut raw = encode_header(&v).to_vec();
        raw.extend_from_slice(v.bytes());
        let back = decode_value("k", Bytes::from(raw)).unwrap();
        prop_assert_eq!(back, v);
    }

    #[test]
    fn arbitrary_stored_bytes_decode_or_are_corrupted(raw in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Err(e) = decode_value("tq/{p/1}/0/x", Bytes::from(raw)) {
            prop_assert_eq!(e.kind(), &ErrorKind::Corrupted);
            prop_assert!(e.message().contains("tq/{p/1}/0/x"), "{}", e);
        }
    }
}
