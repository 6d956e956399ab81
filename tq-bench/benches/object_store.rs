//! Criterion: the KV backend on object storage (`file://`, a local directory): put, get and
//! clear next to std::fs writing, reading and removing the same cells as files.
//! Run: `cargo bench -p tq-bench --bench object_store [-- simple-small]`

mod common;

use common::{criterion, fs_baseline, put_get_clear, runtime, Workload};

fn main() {
    let mut c = criterion(3);
    let rt = runtime();
    let root = tempfile::tempdir_in(std::env::temp_dir()).expect("a temp dir");
    let (store, raw) = (root.path().join("store"), root.path().join("raw"));
    std::fs::create_dir_all(&store).expect("the store dir");
    std::fs::create_dir_all(&raw).expect("the raw dir");
    let config = tq::Config::from_toml(&format!(
        "[storage]\nbackend = \"kv\"\n[storage.kv]\nstores = [{{ url = \"file://{}\" }}]\n",
        store.display()
    ))
    .expect("configuration");
    let tq = tq::Client::embedded(config).expect("embedded client on object storage");
    let w = Workload::new("simple-small");
    let mut g = w.group(&mut c, "object-store");
    fs_baseline(&mut g, &w, &raw);
    put_get_clear(&mut g, &rt, &tq, &w);
    g.finish();
    drop(tq);
    c.final_summary();
}
