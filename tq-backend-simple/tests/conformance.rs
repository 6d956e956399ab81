//! The backend conformance suite of tq-core, against SimpleStorage over in-memory units.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
use std::sync::Arc;
use tq_backend_simple::{SimpleConfig, SimpleStorage};
use tq_core::StorageManager;

fn make(units: usize) -> Arc<dyn StorageManager> {
    Arc::new(SimpleStorage::in_memory(units, SimpleConfig::default()).expect("valid config"))
}

#[tokio::test]
async fn conformance_one_unit() {
    tq_core::testkit::run_all(|| async { make(1) }).await;
}

#[tokio::test]
async fn conformance_three_units() {
    tq_core::testkit::run_all(|| async { make(3) }).await;
}

#[tokio::test]
async fn conformance_with_eager_compaction() {
    // Threshold 1 compacts on every partial clear or overwrite: the suite must not notice.
    tq_core::testkit::run_all(|| async {
        let config = SimpleConfig {
            compaction_threshold: 1.0,
            ..SimpleConfig::default()
        };
        Arc::new(SimpleStorage::in_memory(3, config).expect("valid config"))
            as Arc<dyn StorageManager>
    })
    .await;
}
