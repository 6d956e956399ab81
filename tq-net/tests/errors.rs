//! Handler errors reach the caller with the same kind and message; requests the handler cannot
//! decode get an error response and leave the connection usable.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
mod common;

use serde::{Deserialize, Serialize};
use tq_core::{Error, ErrorKind, Result};
use tq_net::{async_trait, CallOptions, Handler, Message, ServerConfig};

#[derive(Serialize, Deserialize)]
enum Request {
    Fail { which: u8 },
    Echo { text: String },
}

fn error_number(which: u8) -> Error {
    match which {
        0 => Error::invalid("duplicate key `k1` in partition `train`"),
        1 => Error::not_found("partition `val`"),
        2 => Error::conflict("sample 17 (generation 3) is being cleared"),
        3 => Error::capacity_exceeded("storage unit 2 is full"),
        4 => Error::data_lost("cell (5, `responses`) is missing on unit 1"),
        5 => Error::unsupported("update", "redis"),
        6 => Error::timeout("waiting for `responses` in `train`"),
        7 => Error::unavailable("storage unit 3 is down"),
        8 => Error::corrupted("tensor bytes do not match the schema"),
        9 => Error::closed("controller shut down"),
        _ => Error::internal("slot table out of sync"),
    }
}

/// An RPC-style handler: decodes its header, fails on request.
struct Rpc;

#[async_trait]
impl Handler for Rpc {
    async fn handle(&self, request: Message) -> Result<Message> {
        match request.decode::<Request>()? {
            Request::Fail { which } => Err(error_number(which)),
            Request::Echo { text } => Message::encode(&text, vec![]),
        }
    }
}

#[tokio::test]
async fn handler_errors_keep_kind_and_message() {
    let server = common::serve(Rpc, ServerConfig::default()).await;
    let peer = server.local_endpoint().clone();
    let pool = common::pool();
    for which in 0..=10u8 {
        let expected = error_number(which);
        let request = Message::encode(&Request::Fail { which }, vec![]).expect("encode");
        // Idempotent: an error answer must still not be retried.
        let err = pool
            .call(&peer, request, CallOptions::idempotent())
            .await
            .expect_err("handler error");
        assert_eq!(err.kind(), expected.kind(), "error {which}");
        assert_eq!(err.message(), expected.message(), "error {which}");
    }
    assert_eq!(
        server.connections_accepted(),
        1,
        "errors do not cost the connection"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn an_undecodable_header_gets_an_error_response_and_the_connection_stays_usable() {
    let server = common::serve(Rpc, ServerConfig::default()).await;
    let peer = server.local_endpoint().clone();
    let pool = common::pool();
    for header in [&b""[..], &b"\xff\xff\xff\xff\xff"[..], &b"\x01"[..]] {
        let request = Message::new(bytes::Bytes::copy_from_slice(header), vec![]);
        let err = pool
            .call(&peer, request, CallOptions::default())
            .await
            .expect_err("undecodable");
        assert!(
            matches!(err.kind(), ErrorKind::Corrupted | ErrorKind::Invalid),
            "{err}"
        );
        assert!(err.message().contains("cannot decode"), "{err}");
    }
    let request = Message::encode(
        &Request::Echo {
            text: "still here".into(),
        },
        vec![],
    )
    .expect("encode");
    let answer = pool
        .call(&peer, request, CallOptions::default())
        .await
        .expect("echo");
    assert_eq!(answer.decode::<String>().expect("decode"), "still here");
    assert_eq!(server.connections_accepted(), 1);
    server.shutdown().await;
}

/// Panics on every request.
struct Panicky;

#[async_trait]
impl Handler for Panicky {
    async fn handle(&self, _request: Message) -> Result<Message> {
        panic!("handler bug");
    }
}

#[tokio::test]
async fn a_panicking_handler_answers_internal_instead_of_leaving_the_caller_waiting() {
    let server = common::serve(Panicky, ServerConfig::default()).await;
    let peer = server.local_endpoint().clone();
    let pool = common::pool(); // 20 s timeout: the answer must come long before
    let started = std::time::Instant::now();
    let err = pool
        .call(&peer, Message::default(), CallOptions::default())
        .await
        .expect_err("panic");
    assert_eq!(err.kind(), &ErrorKind::Internal);
    assert!(err.message().contains("panicked"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    server.shutdown().await;
}

#[tokio::test]
async fn a_request_over_the_clients_own_limits_is_refused_before_sending() {
    let server = common::serve(common::Echo, ServerConfig::default()).await;
    let peer = server.local_endpoint().clone();
    let pool = tq_net::Pool::new(tq_net::ClientConfig {
        limits: tq_net::Limits {
            max_body_bytes: 10,
            ..tq_net::Limits::default()
        },
        ..tq_net::ClientConfig::default()
    });
    let request = Message::new(bytes::Bytes::new(), vec![bytes::Bytes::from(vec![0u8; 11])]);
    let err = pool
        .call(&peer, request, CallOptions::idempotent())
        .await
        .expect_err("too big");
    assert_eq!(err.kind(), &ErrorKind::Invalid);
    assert!(err.message().contains("max_body_bytes"), "{err}");
    assert!(err.message().contains(&peer.to_string()), "{err}");
    server.shutdown().await;
}
