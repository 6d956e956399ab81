//! Helpers shared by the controller's test files.

#![allow(dead_code)] // each test file uses its own subset
use tq_controller::{ControlPlane, Controller, GetMetaMode, GetMetaRequest};
use tq_core::SampleId;

/// A new empty directory under the system's temp dir, named after `tag` and this process.
pub fn tempdir(tag: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("tq-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Everything a controller shows of its state (partitions, keys and tags, production of field
/// `x`, consumption by task `t`), comparable across controllers.
pub async fn picture(c: &Controller) -> String {
    let mut partitions = c.list_partitions().await.unwrap();
    partitions.sort();
    let mut out = format!("{partitions:?}\n");
    for p in &partitions {
        out += &format!("{:?}\n", c.kv_list(Some(p)).await.unwrap());
        out += &format!(
            "{:?}\n",
            c.production_status(p, &["x".into()]).await.unwrap()
        );
        out += &format!("{:?}\n", c.consumption_status(p, "t").await.unwrap());
    }
    out
}

/// Inserts `n` samples into partition `p` (no field written yet); their ids.
pub async fn insert(c: &Controller, p: &str, n: usize) -> Vec<SampleId> {
    let req = GetMetaRequest {
        partition: p.into(),
        fields: vec![],
        mode: GetMetaMode::Insert { count: n },
        sampler: None,
        dp_rank: None,
        batch_index: None,
        sampler_args: None,
    };
    c.get_meta(req).await.unwrap().samples().to_vec()
}
