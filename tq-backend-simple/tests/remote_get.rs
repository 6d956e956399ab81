//! Gets from units over real loopback TCP: large dense rows are read straight into the final
//! column buffer (one allocation, no packing copy), everything else as before, and the data is
//! the same either way.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
#![cfg(feature = "net")]

use bytes::BytesMut;
use std::sync::Arc;
use tq_backend_simple::{
    Fetched, MemoryUnit, RemoteUnit, SimpleStorage, StorageUnit, UnitPut, UnitRows, UnitServer,
    PLACE_MIN_ROW_BYTES,
};
use tq_core::{
    Batch, BatchMeta, Bytes, Column, DType, FieldMeta, SampleId, StorageManager, Tensor, Value,
};
use tq_net::{ClientConfig, Endpoint, Pool, Server, ServerConfig};

async fn unit_server(id: &str) -> (Server, Arc<MemoryUnit>) {
    let unit = Arc::new(MemoryUnit::new(id));
    let server = Server::bind(
        &Endpoint::tcp("127.0.0.1:0"),
        ServerConfig {
            name: id.to_owned(),
            ..ServerConfig::default()
        },
        Arc::new(UnitServer::new(unit.clone())),
    )
    .await
    .unwrap();
    (server, unit)
}

/// Two unit servers and a manager that reaches them over TCP.
async fn remote_storage() -> (Vec<Server>, SimpleStorage) {
    let pool = Pool::new(ClientConfig::default());
    let mut servers = Vec::new();
    let mut units: Vec<Arc<dyn StorageUnit>> = Vec::new();
    for id in ["u0", "u1"] {
        let (server, _) = unit_server(id).await;
        units.push(Arc::new(RemoteUnit::new(
            id,
            server.local_endpoint().clone(),
            pool.clone(),
        )));
        servers.push(server);
    }
    (servers, SimpleStorage::new(units).unwrap())
}

fn pattern(rows: usize, row_bytes: usize, seed: u8) -> Tensor {
    let data: Vec<u8> = (0..rows * row_bytes)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    Tensor::new(DType::U8, vec![rows, row_bytes], Bytes::from(data)).unwrap()
}

fn mixed_batch(rows: usize) -> Batch {
    let big = PLACE_MIN_ROW_BYTES + 8;
    let ragged = (0..rows)
        .map(|r| Tensor::from_slice(vec![r + 1], &vec![r as f32; r + 1]).unwrap())
        .collect();
    Batch::from_columns([
        ("big", Column::Dense(pattern(rows, big, 1))),
        ("small", Column::Dense(pattern(rows, 16, 2))),
        ("ragged", Column::Ragged(ragged)),
        (
            "text",
            Column::Objects((0..rows).map(|r| Bytes::from(format!("row {r}"))).collect()),
        ),
    ])
    .unwrap()
}

#[tokio::test]
async fn remote_get_returns_exactly_what_was_put() {
    let (_servers, storage) = remote_storage().await;
    let rows = 9;
    let batch = mixed_batch(rows);
    // Indexes out of order and spread over both units.
    let samples: Vec<SampleId> = [7u32, 2, 4, 11, 0, 5, 8, 1, 3]
        .iter()
        .map(|&i| SampleId::new(i, 0))
        .collect();
    let meta = BatchMeta::new("p", samples)
        .with_fields(batch.schemas())
        .unwrap();
    storage.put(&meta, &batch).await.unwrap();
    let back = storage.get(&meta).await.unwrap();
    assert_eq!(back, batch);
    // The large dense field is one contiguous column.
    let Some(Column::Dense(t)) = back.column("big") else {
        panic!("big is not dense: {:?}", back.column("big"));
    };
    assert_eq!(t.shape(), &[rows, PLACE_MIN_ROW_BYTES + 8]);

    // A subset, in another order, with a duplicate.
    let sub = meta.select_samples(&[3, 0, 3, 8]).unwrap();
    let got = storage.get(&sub).await.unwrap();
    assert_eq!(got, batch.select_rows(&[3, 0, 3, 8]).unwrap());
}

#[tokio::test]
async fn a_schema_that_does_not_match_the_cells_falls_back_to_packing() {
    let (_servers, storage) = remote_storage().await;
    let rows = 4;
    let big = PLACE_MIN_ROW_BYTES * 2;
    let batch = Batch::from_columns([("x", Column::Dense(pattern(rows, big, 9)))]).unwrap();
    let samples: Vec<SampleId> = (0..rows as u32).map(|i| SampleId::new(i, 0)).collect();
    let meta = BatchMeta::new("p", samples.clone())
        .with_fields(batch.schemas())
        .unwrap();
    storage.put(&meta, &batch).await.unwrap();
    // Metadata that claims another row shape of the same byte length (the pieces fit, the
    // shapes do not) and one that claims another length (nothing fits).
    for shape in [vec![2, big / 2], vec![big / 2]] {
        let mut schemas = batch.schemas();
        schemas.insert("x".into(), FieldMeta::dense(DType::U8, shape.clone()));
        let lying = BatchMeta::new("p", samples.clone())
            .with_fields(schemas)
            .unwrap();
        let got = storage.get(&lying).await.unwrap();
        assert_eq!(got, batch, "claimed row shape {shape:?}");
    }
}

#[tokio::test]
async fn get_into_fills_the_buffers_that_fit_and_returns_the_rest() {
    let (server, unit) = unit_server("u").await;
    let samples = vec![SampleId::new(0, 0), SampleId::new(1, 0)];
    let t = pattern(2, 64, 5);
    let mut fields = std::collections::BTreeMap::new();
    fields.insert(
        "x".to_string(),
        UnitRows {
            values: vec![Value::Tensor(t.row(0)), Value::Tensor(t.row(1))],
            shared_allocation: false,
        },
    );
    unit.put(UnitPut {
        samples: samples.clone(),
        fields,
    })
    .await
    .unwrap();
    let remote = RemoteUnit::new(
        "u",
        server.local_endpoint().clone(),
        Pool::new(ClientConfig::default()),
    );
    assert!(remote.reads_into_buffers());
    // Row 0 gets a buffer of the right size, row 1 one that is too small.
    let buffers = vec![vec![Some(BytesMut::zeroed(64)), Some(BytesMut::zeroed(63))]];
    let got = remote
        .get_into(&["x".to_string()], &samples, buffers)
        .await
        .unwrap();
    match &got[0][0] {
        Fetched::Placed {
            dtype,
            shape,
            bytes,
        } => {
            assert_eq!((*dtype, shape.as_slice()), (DType::U8, &[64usize][..]));
            assert_eq!(&bytes[..], t.row(0).data().as_ref());
        }
        other => panic!("row 0 was not placed: {other:?}"),
    }
    match &got[0][1] {
        Fetched::Value(Value::Tensor(v)) => assert_eq!(v, &t.row(1)),
        other => panic!("row 1 should come back as a value: {other:?}"),
    }
    // In-process units never place.
    assert!(!unit.reads_into_buffers());
}

/// Ragged rows that are all large are read into one buffer too (one piece per row); rows the
/// metadata describes wrongly come back from the values, unchanged.
#[tokio::test]
async fn large_ragged_rows_are_read_into_one_buffer() {
    let (_servers, storage) = remote_storage().await;
    let rows = 5;
    let ragged: Vec<Tensor> = (0..rows)
        .map(|r| pattern(1, PLACE_MIN_ROW_BYTES + 24 * r, r as u8).row(0))
        .collect();
    let batch = Batch::from_columns([("r", Column::Ragged(ragged.clone()))]).unwrap();
    let samples: Vec<SampleId> = [4u32, 1, 2, 7, 0]
        .iter()
        .map(|&i| SampleId::new(i, 0))
        .collect();
    let meta = BatchMeta::new("p", samples.clone())
        .with_fields(batch.schemas())
        .unwrap();
    storage.put(&meta, &batch).await.unwrap();
    let back = storage.get(&meta).await.unwrap();
    assert_eq!(back, batch);
    let Some(Column::Ragged(got)) = back.column("r") else {
        panic!("r is not ragged: {:?}", back.column("r"));
    };
    // Placed rows are consecutive pieces of one allocation, in row order.
    for pair in got.windows(2) {
        let end = pair[0].data().as_ptr() as usize + pair[0].data().len();
        assert_eq!(
            pair[1].data().as_ptr() as usize,
            end,
            "rows share one buffer"
        );
    }
    // Metadata claiming other per-row shapes: the values decide.
    let mut schemas = batch.schemas();
    let swapped: Vec<Vec<usize>> = ragged.iter().rev().map(|t| t.shape().to_vec()).collect();
    schemas.insert("r".into(), FieldMeta::from_shapes(DType::U8, swapped));
    let lying = BatchMeta::new("p", samples).with_fields(schemas).unwrap();
    assert_eq!(storage.get(&lying).await.unwrap(), batch);
}
