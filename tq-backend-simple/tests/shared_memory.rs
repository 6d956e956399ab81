//! Same-host shared memory between a remote unit stub and a unit server: real memfd segments
//! passed over a real Unix socket beside a real loopback TCP endpoint. Large puts land in the
//! unit as slices of the client's sealed segment, gets map the unit's segments (no copy
//! without a buffer, one copy into a buffer), a read survives a clear, and a unit that offers
//! no channel gets everything over TCP unchanged.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
#![cfg(all(feature = "net", target_os = "linux"))]

use bytes::BytesMut;
use std::collections::BTreeMap;
use std::sync::Arc;
use tq_backend_simple::{
    Fetched, MemoryUnit, RemoteUnit, SimpleStorage, StorageUnit, UnitPut, UnitRows, UnitServer,
};
use tq_core::{
    Batch, BatchMeta, Bytes, Column, DType, FieldFilter, SampleId, StorageManager, Tensor, Value,
};
use tq_net::{ClientConfig, Endpoint, Pool, Server, ServerConfig};

/// A unit server on loopback TCP; with `offer`, it also offers its shared-memory channel.
async fn unit_server(id: &str, offer: bool) -> (Server, Arc<MemoryUnit>, Arc<UnitServer>) {
    let unit = Arc::new(MemoryUnit::new(id));
    let handler = Arc::new(UnitServer::new(unit.clone()));
    if offer {
        handler.offer_shared_memory().unwrap();
    }
    let server = Server::bind(
        &Endpoint::tcp("127.0.0.1:0"),
        ServerConfig {
            name: id.to_owned(),
            ..ServerConfig::default()
        },
        handler.clone(),
    )
    .await
    .unwrap();
    (server, unit, handler)
}

fn stub(server: &Server, id: &str) -> RemoteUnit {
    RemoteUnit::new(
        id,
        server.local_endpoint().clone(),
        Pool::new(ClientConfig::default()),
    )
    .with_shared_memory(true)
}

/// The memfd mappings of this process (`/proc/self/maps` names them `/memfd:<name> (deleted)`).
fn memfd_ranges() -> Vec<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter(|line| line.contains("/memfd:tq-cells"))
        .filter_map(|line| {
            let (lo, hi) = line.split_once(' ')?.0.split_once('-')?;
            Some((
                usize::from_str_radix(lo, 16).ok()?,
                usize::from_str_radix(hi, 16).ok()?,
            ))
        })
        .collect()
}

/// Whether `bytes` lie in one memfd mapping of this process.
fn in_memfd(bytes: &[u8]) -> bool {
    let at = bytes.as_ptr() as usize;
    memfd_ranges()
        .iter()
        .any(|&(lo, hi)| lo <= at && at + bytes.len() <= hi)
}

/// Whether every byte of `bytes` lies in some memfd mapping (a column joined from several).
fn all_in_memfd(bytes: &[u8]) -> bool {
    let mut ranges = memfd_ranges();
    ranges.sort_unstable();
    let (mut at, end) = (
        bytes.as_ptr() as usize,
        bytes.as_ptr() as usize + bytes.len(),
    );
    for (lo, hi) in ranges {
        if lo <= at && at < hi {
            at = hi;
        }
    }
    at >= end
}

fn pattern(rows: usize, row_bytes: usize, seed: u8) -> Tensor {
    let data: Vec<u8> = (0..rows * row_bytes)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect();
    Tensor::new(DType::U8, vec![rows, row_bytes], Bytes::from(data)).unwrap()
}

fn put_of(samples: &[SampleId], t: &Tensor) -> UnitPut {
    let values = (0..samples.len())
        .map(|r| Value::Tensor(t.row(r)))
        .collect();
    UnitPut {
        samples: samples.to_vec(),
        fields: BTreeMap::from([("x".to_string(), UnitRows::separate(values))]),
    }
}

fn ids(n: u32) -> Vec<SampleId> {
    (0..n).map(|i| SampleId::new(i, 0)).collect()
}

#[tokio::test]
async fn large_cells_move_through_shared_memory_both_ways() {
    let (server, unit, _handler) = unit_server("u", true).await;
    let remote = stub(&server, "u");
    let samples = ids(4);
    let t = pattern(4, 256 << 10, 3);
    remote.put(put_of(&samples, &t)).await.unwrap();
    assert!(remote.uses_shared_memory());

    // The unit keeps the cells as slices of the client's sealed segment: no copy there.
    let stored = unit.get(&["x".to_string()], &samples).await.unwrap();
    for (r, v) in stored[0].iter().enumerate() {
        assert_eq!(v, &Value::Tensor(t.row(r)));
        assert!(in_memfd(v.bytes()), "row {r} is not in a shared segment");
    }

    // Without buffers, the rows come back as views of the mapped segment.
    let got = remote
        .get_into(&["x".to_string()], &samples, vec![vec![None; 4]])
        .await
        .unwrap();
    for (r, f) in got[0].iter().enumerate() {
        let Fetched::Value(v) = f else {
            panic!("row {r}: nothing was offered, yet it was placed")
        };
        assert_eq!(v, &Value::Tensor(t.row(r)));
        assert!(in_memfd(v.bytes()), "row {r} was copied");
    }

    // Rows of whole pages stay views even where a buffer is offered (the caller can map a
    // column of them together); rows of part pages are copied once into a buffer that fits,
    // and one whose buffer does not fit comes back as a value.
    let offered: Vec<Option<BytesMut>> =
        (0..4).map(|_| Some(BytesMut::zeroed(256 << 10))).collect();
    let got = remote
        .get_into(&["x".to_string()], &samples, vec![offered])
        .await
        .unwrap();
    for (r, f) in got[0].iter().enumerate() {
        let Fetched::Value(v) = f else {
            panic!("row {r}: a row of whole pages was copied into the buffer")
        };
        assert!(in_memfd(v.bytes()), "row {r} was copied");
    }
    let row = (256 << 10) + 100;
    let t = pattern(4, row, 7);
    remote.put(put_of(&samples, &t)).await.unwrap();
    let mut offered: Vec<Option<BytesMut>> = (0..4).map(|_| Some(BytesMut::zeroed(row))).collect();
    offered[2] = Some(BytesMut::zeroed(100));
    let got = remote
        .get_into(&["x".to_string()], &samples, vec![offered])
        .await
        .unwrap();
    for (r, f) in got[0].iter().enumerate() {
        match (r, f) {
            (2, Fetched::Value(v)) => assert_eq!(v, &Value::Tensor(t.row(2))),
            (
                _,
                Fetched::Placed {
                    dtype,
                    shape,
                    bytes,
                },
            ) if r != 2 => {
                assert_eq!((*dtype, shape.as_slice()), (DType::U8, &[row][..]));
                assert_eq!(&bytes[..], t.row(r).data().as_ref());
            }
            _ => panic!("row {r}: {f:?}"),
        }
    }
}

#[tokio::test]
async fn a_read_stays_valid_after_the_unit_clears_the_cells() {
    let (server, unit, _handler) = unit_server("u", true).await;
    let remote = stub(&server, "u");
    let samples = ids(2);
    let t = pattern(2, 512 << 10, 7);
    remote.put(put_of(&samples, &t)).await.unwrap();
    let got = remote.get(&["x".to_string()], &samples).await.unwrap();
    remote.clear(&samples, &FieldFilter::All).await.unwrap();
    assert_eq!(unit.stats().await.unwrap().cells, 0, "the unit let go");
    let e = remote.get(&["x".to_string()], &samples).await.unwrap_err();
    assert_eq!(e.kind(), &tq_core::ErrorKind::NotFound, "{e}");
    // The mapping the reader holds keeps its pages: the bytes are unchanged.
    for (r, v) in got[0].iter().enumerate() {
        assert!(in_memfd(v.bytes()));
        assert_eq!(v, &Value::Tensor(t.row(r)));
    }
}

/// A unit that frees large clears behind its answer, as `tq serve` and `tq storage-unit` run
/// theirs; with `offer`, it also offers its shared-memory channel.
async fn freeing_unit_server(id: &str, offer: bool) -> (Server, Arc<MemoryUnit>) {
    let unit = Arc::new(MemoryUnit::new(id).free_cleared_behind(true));
    let handler = Arc::new(UnitServer::new(unit.clone()));
    if offer {
        handler.offer_shared_memory().unwrap();
    }
    let config = ServerConfig {
        name: id.to_owned(),
        ..ServerConfig::default()
    };
    let server = Server::bind(&Endpoint::tcp("127.0.0.1:0"), config, handler)
        .await
        .unwrap();
    (server, unit)
}

#[tokio::test]
async fn cells_in_shared_memory_are_freed_behind_a_clear_whatever_its_size() {
    use tq_unit::reclaim::{self, RECLAIMED_BEHIND, RECLAIMED_INLINE};
    let samples = ids(4);
    let t = pattern(4, 256 << 10, 5);
    // 1 MiB is far below the size from which a clear frees heap buffers behind its answer;
    // through the channel its cells are a segment, which the unit frees behind it all the same.
    let (server, unit) = freeing_unit_server("u", true).await;
    let remote = stub(&server, "u");
    remote.put(put_of(&samples, &t)).await.unwrap();
    assert!(remote.uses_shared_memory());
    remote.clear(&samples, &FieldFilter::All).await.unwrap();
    reclaim::wait_freed();
    let counters = unit.stats().await.unwrap().counters;
    assert_eq!(counters[RECLAIMED_BEHIND], 1 << 20, "{counters:?}");
    assert_eq!(counters[RECLAIMED_INLINE], 0, "{counters:?}");

    // The same cells over TCP are heap buffers: freed by the clear itself.
    let (server, unit) = freeing_unit_server("v", false).await;
    let remote = stub(&server, "v");
    remote.put(put_of(&samples, &t)).await.unwrap();
    assert!(!remote.uses_shared_memory());
    remote.clear(&samples, &FieldFilter::All).await.unwrap();
    let counters = unit.stats().await.unwrap().counters;
    assert_eq!(counters[RECLAIMED_INLINE], 1 << 20, "{counters:?}");
    assert_eq!(counters[RECLAIMED_BEHIND], 0, "{counters:?}");
}

#[tokio::test]
async fn small_puts_and_cells_written_over_tcp_still_read_back() {
    let (server, unit, _handler) = unit_server("u", true).await;
    let remote = stub(&server, "u");
    // Below the threshold: over TCP, so the unit's cells are slices of a receive buffer.
    let small = pattern(3, 64, 1);
    remote.put(put_of(&ids(3), &small)).await.unwrap();
    let stored = unit.get(&["x".to_string()], &ids(3)).await.unwrap();
    assert!(
        !in_memfd(stored[0][0].bytes()),
        "a small put took a segment"
    );
    // The stub saw the cells' size at the put: the small get skips the channel too.
    let got = remote.get(&["x".to_string()], &ids(3)).await.unwrap();
    assert_eq!(remote.gets_through_shared_memory(), 0);
    for (r, v) in got[0].iter().enumerate() {
        assert_eq!(v, &Value::Tensor(small.row(r)));
    }
}

/// A stub that never wrote a field takes the channel for its first get of it, learns the
/// size, and sends further small gets of it over TCP; a get of many rows of the same field
/// (over the bound in all) and a get of a large field still take the channel.
#[tokio::test]
async fn gets_known_to_be_small_go_over_tcp_and_large_ones_through_the_channel() {
    let (server, _unit, _handler) = unit_server("u", true).await;
    let writer = stub(&server, "u");
    let small = pattern(128, 4096, 1); // 128 rows of 4 KiB: 512 KiB in all
    let samples = ids(128);
    writer.put(put_of(&samples, &small)).await.unwrap();

    let reader = stub(&server, "u");
    let x = ["x".to_string()];
    let first = reader.get(&x, &samples[..1]).await.unwrap();
    assert_eq!(first[0][0], Value::Tensor(small.row(0)));
    assert_eq!(reader.gets_through_shared_memory(), 1, "size not known yet");
    for r in 1..4 {
        let got = reader.get(&x, &samples[r..r + 1]).await.unwrap();
        assert_eq!(got[0][0], Value::Tensor(small.row(r)));
    }
    assert_eq!(
        reader.gets_through_shared_memory(),
        1,
        "4 KiB gets over TCP"
    );
    let all = reader.get(&x, &samples).await.unwrap();
    assert_eq!(all[0].len(), 128);
    assert_eq!(all[0][127], Value::Tensor(small.row(127)));
    assert_eq!(
        reader.gets_through_shared_memory(),
        2,
        "512 KiB through the channel"
    );
    assert!(reader.uses_shared_memory());
}

#[tokio::test]
async fn a_unit_that_offers_no_channel_gets_everything_over_tcp() {
    let (server, unit, _handler) = unit_server("u", false).await;
    let remote = stub(&server, "u");
    let samples = ids(2);
    let t = pattern(2, 300 << 10, 9);
    remote.put(put_of(&samples, &t)).await.unwrap();
    assert!(!remote.uses_shared_memory());
    let stored = unit.get(&["x".to_string()], &samples).await.unwrap();
    assert!(!in_memfd(stored[0][0].bytes()));
    let got = remote.get(&["x".to_string()], &samples).await.unwrap();
    assert_eq!(got[0][1], Value::Tensor(t.row(1)));
}

/// A whole manager over two same-host units: a batch of mixed fields comes back equal, its
/// dense column of whole-page rows joined from the units' segments without a copy.
#[tokio::test]
async fn a_manager_over_same_host_units_returns_what_was_put() {
    let mut servers = Vec::new();
    let mut units: Vec<Arc<dyn StorageUnit>> = Vec::new();
    for id in ["u0", "u1"] {
        let (server, _, handler) = unit_server(id, true).await;
        units.push(Arc::new(stub(&server, id)));
        servers.push((server, handler));
    }
    let storage = SimpleStorage::new(units).unwrap();
    let rows = 6;
    let batch = Batch::from_columns([
        ("big", Column::Dense(pattern(rows, 200 << 10, 4))),
        ("odd", Column::Dense(pattern(rows, (200 << 10) + 8, 6))),
        ("small", Column::Dense(pattern(rows, 8, 5))),
        (
            "text",
            Column::Objects((0..rows).map(|r| Bytes::from(format!("row {r}"))).collect()),
        ),
    ])
    .unwrap();
    let samples: Vec<SampleId> = [5u32, 0, 3, 1, 4, 2]
        .iter()
        .map(|&i| SampleId::new(i, 0))
        .collect();
    let meta = BatchMeta::new("p", samples)
        .with_fields(batch.schemas())
        .unwrap();
    storage.put(&meta, &batch).await.unwrap();
    let got = storage.get(&meta).await.unwrap();
    assert_eq!(got, batch);
    // The column of whole-page rows is the units' own pages, mapped side by side; the one of
    // part-page rows was copied into a buffer of this process.
    let data = |name: &str| match &got.columns()[name] {
        Column::Dense(t) => t.data().clone(),
        other => panic!("{name}: {other:?}"),
    };
    assert!(all_in_memfd(&data("big")), "the big column was copied");
    assert!(!in_memfd(&data("odd")) && !all_in_memfd(&data("odd")));
    let sub = meta.select_samples(&[4, 1, 4]).unwrap();
    assert_eq!(
        storage.get(&sub).await.unwrap(),
        batch.select_rows(&[4, 1, 4]).unwrap()
    );
}

/// Rows of one page (below the size gets place into offered buffers) are still mapped side by
/// side when the column's rows lie in long enough runs of one segment: a batch of consecutive
/// indexes on one unit, or on two (runs of 16 rows, 64 KiB, per unit), and copied when they
/// alternate between two units' segments row by row; all read back equal.
#[tokio::test]
async fn page_rows_in_long_runs_are_joined_and_alternating_ones_copied() {
    for units_count in [1usize, 2] {
        let mut servers = Vec::new();
        let mut units: Vec<Arc<dyn StorageUnit>> = Vec::new();
        for u in 0..units_count {
            let id = format!("u{u}");
            let (server, _, handler) = unit_server(&id, true).await;
            units.push(Arc::new(stub(&server, &id)));
            servers.push((server, handler));
        }
        let storage = SimpleStorage::new(units).unwrap();
        let rows = 160; // 640 KiB: over the size below which gets go over TCP, on each unit
        let batch = Batch::from_columns([("x", Column::Dense(pattern(rows, 4096, 9)))]).unwrap();
        let meta = BatchMeta::new("p", ids(rows as u32))
            .with_fields(batch.schemas())
            .unwrap();
        storage.put(&meta, &batch).await.unwrap();
        let got = storage.get(&meta).await.unwrap();
        assert_eq!(got, batch, "{units_count} unit(s)");
        let Column::Dense(column) = &got.columns()["x"] else {
            panic!("{units_count} unit(s): not a dense column");
        };
        // One unit: one run of 640 KiB in its segment. Two: runs of 64 KiB. Both mapped.
        assert!(all_in_memfd(column.data()), "{units_count} unit(s)");
        if units_count == 2 {
            // Row by row from alternating units (indexes 0, 16, 1, 17, ...): runs of 4 KiB.
            let alternating: Vec<usize> = (0..rows / 2)
                .map(|i| (i % 16) + (i / 16) * 32)
                .flat_map(|p| [p, p + 16])
                .collect();
            let sub = meta.select_samples(&alternating).unwrap();
            let got = storage.get(&sub).await.unwrap();
            assert_eq!(got, batch.select_rows(&alternating).unwrap());
            let Column::Dense(column) = &got.columns()["x"] else {
                panic!("alternating rows: not a dense column");
            };
            assert!(!all_in_memfd(column.data()), "alternating rows were mapped");
        }
    }
}
