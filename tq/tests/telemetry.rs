//! An embedded client that installs the Prometheus exporter through its builder and reads its
//! own metrics in code: request counters of the controller and storage roles, the state gauges,
//! the SSD engine's bytes and the KV store's command latency. One test per process: the
//! exporter is process-global.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use tq::telemetry::{Metrics, MetricsExporter};
use tq::{Batch, Column, Tensor};
use tq::{Client, Config};

/// `n` rows of `width` i64.
fn rows(n: usize, width: usize) -> Batch {
    let v: Vec<i64> = (0..(n * width) as i64).collect();
    Batch::from_columns([(
        "x",
        Column::Dense(Tensor::from_slice(vec![n, width], &v).unwrap()),
    )])
    .unwrap()
}

#[tokio::test]
async fn an_embedded_client_reads_its_own_metrics() {
    assert!(MetricsExporter::installed().is_none());
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::default();
    cfg.storage.ssd.enabled = true;
    cfg.storage.ssd.path = Some(dir.path().to_path_buf());
    cfg.storage.ssd.threshold_bytes = 256;
    let ssd = Client::builder().config(cfg).metrics(true).build().unwrap();
    assert!(MetricsExporter::installed().is_some());

    let p = ssd.partition("p");
    let keys = ["a", "b", "c", "d", "e"];
    p.kv_batch_put(&keys, &rows(5, 64), None).await.unwrap(); // 512-byte cells: on disk
    p.kv_batch_get(&keys, None).await.unwrap();
    p.kv_clear(&keys[..2]).await.unwrap();

    let m = ssd.metrics().await.unwrap();
    let op = |name| [("op_type", name)];
    let c = |metric: &str, name| m.sum(metric, &op(name));
    assert_eq!(
        c("tq_controller_request_samples_total", "NOTIFY_DATA_UPDATE"),
        5.0
    );
    assert_eq!(c("tq_controller_request_samples_total", "CLEAR_META"), 2.0);
    assert_eq!(c("tq_storage_request_samples_total", "PUT_DATA"), 5.0);
    assert_eq!(c("tq_storage_request_samples_total", "GET_DATA"), 5.0);
    assert_eq!(c("tq_storage_request_errors_total", "PUT_DATA"), 0.0);
    assert_eq!(
        m.value("tq_partition_samples_total", &[("partition_id", "p")]),
        Some(3.0)
    );
    assert_eq!(m.sum("tq_storage_active_keys_total", &[]), 3.0);
    assert_eq!(m.sum("tq_storage_offloaded_bytes", &[]), 3.0 * 512.0);
    assert_eq!(m.sum("tq_ssd_write_bytes_total", &[]), 5.0 * 512.0);
    assert_eq!(m.sum("tq_ssd_read_bytes_total", &[]), 5.0 * 512.0);
    assert!(m.sum("tq_ssd_write_duration_seconds_count", &[]) >= 1.0);
    assert!(m.has("tq_storage_ssd_fallback_values_total"));

    // A second client in the process shares the exporter; on a KV backend its store commands
    // are timed per store and command.
    let kv = Client::builder()
        .config(Config::from_toml("[storage]\nbackend = \"kv\"\n").unwrap())
        .metrics(true)
        .build()
        .unwrap();
    kv.partition("k")
        .kv_batch_put(&["x"], &rows(1, 4), None)
        .await
        .unwrap();
    let m = kv.metrics().await.unwrap();
    // A small put sends cells and generation keys as one `mset_then_raise` command.
    let put = [("store", "memory"), ("command", "mset_then_raise")];
    assert!(
        m.value("tq_kv_store_command_duration_seconds_count", &put)
            .unwrap()
            >= 1.0
    );
    assert!(
        m.label_sets("tq_storage_bytes").is_empty(),
        "a KV store has no units"
    );
    assert_eq!(
        m.value("tq_partition_samples_total", &[("partition_id", "k")]),
        Some(1.0)
    );
}
