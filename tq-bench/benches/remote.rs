//! Criterion: the remote deployment: a controller and two storage-unit processes on loopback
//! (started by this benchmark, stopped at its end), put, get and clear of the simple workloads
//! next to raw loopback TCP carrying the same bytes, and the clear-28 workload
//! (`remote/clear-28`).
//! Run: `cargo bench -p tq-bench --bench remote [-- simple-small]`

mod common;

use common::{
    clear_28, criterion, put_get_clear, runtime, serve_if_child, tcp_baseline, Deployment, Workload,
};

fn main() {
    serve_if_child();
    let mut c = criterion(3);
    let rt = runtime();
    let deployment = Deployment::start();
    let tq = rt
        .block_on(tq::Client::connect(&deployment.url))
        .expect("connect to the deployment");
    for name in ["simple-small", "simple-medium"] {
        let w = Workload::new(name);
        let mut g = w.group(&mut c, "remote");
        tcp_baseline(&mut g, w.bytes() as usize);
        put_get_clear(&mut g, &rt, &tq, &w);
        g.finish();
    }
    clear_28(&mut c, "remote", &rt, &tq);
    drop(tq);
    drop(deployment);
    c.final_summary();
}
