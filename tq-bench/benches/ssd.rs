//! Criterion: the embedded deployment with SSD offload (every cell of the workload large enough
//! to go to disk): put, get and clear next to std::fs writing, reading and removing the same
//! cells as files of their own in the same file system.
//! Run: `cargo bench -p tq-bench --bench ssd`

mod common;

use common::{criterion, fs_baseline, put_get_clear, runtime, Workload};

fn main() {
    let mut c = criterion(3);
    let rt = runtime();
    let root = tempfile::tempdir_in(std::env::temp_dir()).expect("a temp dir");
    let (units, raw) = (root.path().join("units"), root.path().join("raw"));
    std::fs::create_dir_all(&raw).expect("the raw dir");
    let mut config = tq::Config::default();
    config.storage.ssd.enabled = true;
    config.storage.ssd.path = Some(units);
    // Every cell of the workload goes to disk.
    config.storage.ssd.threshold_bytes = 512;
    let tq = tq::Client::embedded(config).expect("embedded client with SSD offload");
    // Large cells are what SSD offload is for: simple-medium's are 16 KiB (4096 per batch).
    let w = Workload::new("simple-medium");
    let mut g = w.group(&mut c, "ssd");
    fs_baseline(&mut g, &w, &raw);
    put_get_clear(&mut g, &rt, &tq, &w);
    g.finish();
    drop(tq);
    c.final_summary();
}
