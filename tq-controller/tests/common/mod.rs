//! Helpers shared by the state-dir tests.

#![allow(dead_code)] // each test file uses its own subset
use tq_controller::{ControlPlane, Controller};

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
