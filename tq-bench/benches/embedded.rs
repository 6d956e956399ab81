//! Criterion: the embedded deployment (controller and in-memory storage units in this
//! process): put, get and clear of the simple workloads next to a memcpy of the same bytes.
//! Run: `cargo bench -p tq-bench --bench embedded [-- simple-small]`

mod common;

use common::{criterion, memcpy, put_get_clear, runtime, Workload};

fn main() {
    let mut c = criterion(3);
    let rt = runtime();
    let tq = tq::Client::embedded(tq::Config::default()).expect("embedded client");
    for name in ["simple-small", "simple-medium"] {
        let w = Workload::new(name);
        let mut g = w.group(&mut c, "embedded");
        memcpy(&mut g, &w);
        put_get_clear(&mut g, &rt, &tq, &w);
        g.finish();
    }
    c.final_summary();
}
