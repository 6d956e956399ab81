//! Requests refused before they reach their handler are metered too. (Which `op_type` each
//! request counts as is its `metric` in the operation table, `ops.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use crate::ControllerConfig;
use tq_net::Handler;

/// The value of the series `name{op_type="op"}` in Prometheus text, or 0.
fn series(text: &str, name: &str, op: &str) -> f64 {
    let prefix = format!("{name}{{op_type=\"{op}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0.0, |v| v.parse().unwrap())
}

#[tokio::test]
async fn requests_refused_before_their_handler_count_as_errors() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let server = metrics::with_local_recorder(&recorder, || {
        let controller = Controller::new(ControllerConfig::default()).unwrap();
        ControllerServer::new(Arc::new(controller), 2)
    });
    let stale = ControlEnvelope {
        epoch: server.epoch() + 1,
        request: ControlRequest::ListPartitions {},
        once: None,
    };
    let refused = server
        .handle(Message::encode(&stale, Vec::new()).unwrap())
        .await;
    assert!(refused.is_err(), "another epoch's request is refused");
    let garbage = Message::new(Bytes::from_static(&[0xff; 3]), Vec::new());
    assert!(server.handle(garbage).await.is_err());
    let current = ControlEnvelope {
        epoch: server.epoch(),
        request: ControlRequest::ListPartitions {},
        once: None,
    };
    server
        .handle(Message::encode(&current, Vec::new()).unwrap())
        .await
        .unwrap();

    let text = handle.render();
    let total = |op| series(&text, "tq_controller_request_total", op);
    let errors = |op| series(&text, "tq_controller_request_errors_total", op);
    assert_eq!(total("GET_LIST_PARTITIONS"), 2.0, "{text}");
    assert_eq!(errors("GET_LIST_PARTITIONS"), 1.0, "{text}");
    assert_eq!((total("UNDECODABLE"), errors("UNDECODABLE")), (1.0, 1.0));
}
