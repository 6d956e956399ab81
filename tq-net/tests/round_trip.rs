//! Round trips over real sockets: a postcard header plus frames (empty ones and a 64 MiB one)
//! arrive intact, as slices of one receive buffer.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
mod common;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use tq_core::Result;
use tq_net::{async_trait, CallOptions, Endpoint, Handler, Message, Server, ServerConfig};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct PutHeader {
    partition: String,
    fields: Vec<String>,
    generation: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct EchoReply {
    request: PutHeader,
    /// The server saw its frames as back-to-back slices of one buffer.
    contiguous_on_server: bool,
}

/// True when the non-empty frames are back to back in memory, right after the header: i.e.
/// slices of one buffer, not separate copies.
fn contiguous(message: &Message) -> bool {
    let mut expected_next = message.header.as_ptr() as usize + message.header.len();
    for frame in message.frames.iter().filter(|f| !f.is_empty()) {
        if frame.as_ptr() as usize != expected_next {
            return false;
        }
        expected_next += frame.len();
    }
    true
}

struct EchoWithCheck;

#[async_trait]
impl Handler for EchoWithCheck {
    async fn handle(&self, request: Message) -> Result<Message> {
        let header: PutHeader = request.decode()?;
        let reply = EchoReply {
            request: header,
            contiguous_on_server: contiguous(&request),
        };
        Message::encode(&reply, request.frames)
    }
}

fn frames() -> Vec<Bytes> {
    let mut big = vec![0xA5u8; 64 << 20];
    // Distinct bytes at the edges and in the middle so misplaced slices would not compare equal.
    big[0] = 1;
    big[(32 << 20) + 7] = 2;
    let last = big.len() - 1;
    big[last] = 3;
    vec![
        Bytes::new(),
        Bytes::from_static(b"input_ids"),
        Bytes::new(),
        Bytes::from(big),
        Bytes::from((0..=255u8).collect::<Vec<u8>>()),
        Bytes::new(),
    ]
}

async fn round_trip(endpoint: Endpoint) {
    let server = Server::bind(&endpoint, ServerConfig::default(), Arc::new(EchoWithCheck))
        .await
        .expect("bind");
    let peer = server.local_endpoint().clone();
    let pool = common::pool();
    let header = PutHeader {
        partition: "train".into(),
        fields: vec!["input_ids".into(), "responses".into()],
        generation: 7,
    };
    let sent = frames();
    let request = Message::encode(&header, sent.clone()).expect("encode");
    assert_eq!(
        request.body_len(),
        sent.iter().map(|f| f.len() as u64).sum::<u64>()
    );
    let answer = pool
        .call(
            &peer,
            request,
            CallOptions::idempotent().with_timeout(Duration::from_secs(60)),
        )
        .await
        .expect("call");
    let reply: EchoReply = answer.decode().expect("decode reply");
    assert_eq!(reply.request, header);
    assert!(
        reply.contiguous_on_server,
        "server frames are slices of one buffer"
    );
    assert!(
        contiguous(&answer),
        "client frames are slices of one buffer"
    );
    assert_eq!(answer.frames.len(), sent.len());
    for (i, (got, want)) in answer.frames.iter().zip(&sent).enumerate() {
        assert_eq!(got.len(), want.len(), "frame {i} length");
        assert!(got == want, "frame {i} content");
    }
    // A second request reuses the connection.
    let small = Message::encode(&header, vec![Bytes::from_static(b"x")]).expect("encode");
    let again = pool
        .call(&peer, small, CallOptions::default())
        .await
        .expect("second call");
    assert_eq!(again.frames, vec![Bytes::from_static(b"x")]);
    assert_eq!(server.connections_accepted(), 1);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_over_tcp() {
    round_trip(common::any_port()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_over_unix_socket() {
    let dir = std::env::temp_dir().join(format!("tq-net-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("rt.sock");
    round_trip(Endpoint::Unix(path.clone())).await;
    assert!(!path.exists(), "shutdown removes the socket file");
    let _ = std::fs::remove_dir(&dir);
}

#[tokio::test]
async fn empty_message_and_frameless_message_round_trip() {
    let server = common::serve(common::Echo, ServerConfig::default()).await;
    let peer = server.local_endpoint().clone();
    let pool = common::pool();
    for request in [
        Message::default(),
        Message::new(Bytes::from_static(b"only a header"), vec![]),
        Message::new(Bytes::new(), vec![Bytes::new(), Bytes::new()]),
    ] {
        let answer = pool
            .call(&peer, request.clone(), CallOptions::default())
            .await
            .expect("call");
        assert_eq!(answer, request);
    }
    server.shutdown().await;
}

#[tokio::test]
async fn stale_unix_socket_file_is_replaced_but_a_live_one_is_not() {
    let dir = std::env::temp_dir().join(format!("tq-net-stale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("s.sock");
    // A socket file whose server is gone.
    drop(std::os::unix::net::UnixListener::bind(&path).expect("bind std"));
    assert!(path.exists());
    let endpoint = Endpoint::Unix(path.clone());
    let server = Server::bind(&endpoint, ServerConfig::default(), Arc::new(common::Echo))
        .await
        .expect("stale socket replaced");
    let second = Server::bind(&endpoint, ServerConfig::default(), Arc::new(common::Echo)).await;
    let err = second.expect_err("live socket must not be stolen");
    assert!(err.to_string().contains("another server"), "{err}");
    common::assert_serving(&common::pool(), &endpoint).await;
    server.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
