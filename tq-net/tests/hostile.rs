//! Garbage, truncated and oversized input: the offending connection is closed quickly, and the
//! server keeps serving everyone else throughout.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
mod common;

use common::{assert_closed_by_server, assert_serving, prefix, raw, raw_handshaken};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tq_net::{Limits, ServerConfig};

const QUICKLY: Duration = Duration::from_secs(3);

fn config() -> ServerConfig {
    ServerConfig {
        limits: Limits {
            max_header_bytes: 1 << 20,
            max_frames: 1024,
            max_body_bytes: 1 << 30,
        },
        ..ServerConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_instead_of_a_handshake_is_closed() {
    let server = common::serve(common::Echo, config()).await;
    let peer = server.local_endpoint().clone();
    let pool = common::pool();
    assert_serving(&pool, &peer).await;

    let version = tq_net::PROTOCOL_VERSION;
    for garbage in [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        vec![0xffu8; 64],
        // Right magic and version, absurd token length (over 4096).
        [&b"TQNET"[..], &[version], b"\r\n\xff\xff"].concat(),
        // Right magic and version, no line break after them.
        [&b"TQNET"[..], &[version], b"\x00\x00\x00\x00"].concat(),
    ] {
        let mut s = raw(&peer).await;
        s.write_all(&garbage).await.expect("write");
        assert_closed_by_server(&mut s, QUICKLY).await;
        assert_serving(&pool, &peer).await;
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_after_a_valid_handshake_is_closed() {
    let server = common::serve(common::Echo, config()).await;
    let peer = server.local_endpoint().clone();
    let pool = common::pool();
    assert_serving(&pool, &peer).await;

    // Non-zero padding: not a message.
    let mut s = raw_handshaken(&peer).await;
    s.write_all(&[0x5au8; 64]).await.expect("write");
    assert_closed_by_server(&mut s, QUICKLY).await;
    assert_serving(&pool, &peer).await;

    // Unknown kind byte.
    let mut s = raw_handshaken(&peer).await;
    s.write_all(&prefix(1, 9, 0, 0)).await.expect("write");
    assert_closed_by_server(&mut s, QUICKLY).await;
    assert_serving(&pool, &peer).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_message_closes_only_its_connection() {
    let server = common::serve(common::Echo, config()).await;
    let peer = server.local_endpoint().clone();
    let pool = common::pool();
    assert_serving(&pool, &peer).await;
    let baseline = server.open_connections();

    let mut s = raw_handshaken(&peer).await;
    let mut bytes = prefix(1, 0, 4, 1);
    bytes.extend_from_slice(&1000u64.to_le_bytes());
    bytes.extend_from_slice(b"hdr!");
    bytes.extend_from_slice(&[1u8; 10]); // 10 of the 1000 body bytes
    s.write_all(&bytes).await.expect("write");
    s.shutdown().await.expect("half-close"); // end of stream mid-message
    assert_closed_by_server(&mut s, QUICKLY).await;
    assert!(
        common::eventually(QUICKLY, || server.open_connections() == baseline).await,
        "the truncated connection was released"
    );
    assert_serving(&pool, &peer).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_limit_claims_are_refused_before_allocating() {
    let server = common::serve(common::Echo, config()).await;
    let peer = server.local_endpoint().clone();
    let pool = common::pool();
    assert_serving(&pool, &peer).await;

    let one_tib_body = {
        let mut b = prefix(1, 0, 0, 1);
        b.extend_from_slice(&(1u64 << 40).to_le_bytes());
        b
    };
    let two_to_31_frames = prefix(2, 0, 0, 1 << 31);
    let huge_header = prefix(3, 0, u32::MAX, 0);
    let overflowing_lengths = {
        let mut b = prefix(4, 0, 0, 2);
        b.extend_from_slice(&u64::MAX.to_le_bytes());
        b.extend_from_slice(&u64::MAX.to_le_bytes());
        b
    };
    for claim in [
        one_tib_body,
        two_to_31_frames,
        huge_header,
        overflowing_lengths,
    ] {
        let mut s = raw_handshaken(&peer).await;
        // Only the prefix (and table) is sent; the server must decide from those alone.
        s.write_all(&claim).await.expect("write");
        assert_closed_by_server(&mut s, QUICKLY).await;
        assert_serving(&pool, &peer).await;
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_hostile_connections_at_once_do_not_stall_the_server() {
    let server = common::serve(common::Echo, config()).await;
    let peer = server.local_endpoint().clone();
    let pool = common::pool();
    // Half-sent messages that stay open: each holds its own connection task only.
    let mut stalled = Vec::new();
    for i in 0..20u64 {
        let mut s = raw_handshaken(&peer).await;
        let mut b = prefix(i, 0, 0, 1);
        b.extend_from_slice(&(1u64 << 29).to_le_bytes());
        b.extend_from_slice(&[0u8; 100]);
        s.write_all(&b).await.expect("write");
        stalled.push(s);
    }
    for _ in 0..10 {
        assert_serving(&pool, &peer).await;
    }
    drop(stalled);
    server.shutdown().await;
}

#[tokio::test]
async fn a_response_kind_sent_to_the_server_gets_an_error_reply_and_the_connection_stays() {
    use tq_net::frame::{read_message, write_message};
    use tq_net::{Message, MessageKind, WireError};
    let server = common::serve(common::Echo, config()).await;
    let peer = server.local_endpoint().clone();
    let mut s = raw_handshaken(&peer).await;
    write_message(&mut s, 77, MessageKind::Response, Message::default())
        .await
        .expect("write");
    let (id, kind, answer) = read_message(&mut s, &Limits::default())
        .await
        .expect("read")
        .expect("an answer");
    assert_eq!((id, kind), (77, MessageKind::Error));
    let error = answer
        .decode::<WireError>()
        .expect("wire error")
        .into_error();
    assert_eq!(error.kind(), &tq_core::ErrorKind::Invalid);
    // Same connection, a proper request now works.
    write_message(&mut s, 78, MessageKind::Request, Message::default())
        .await
        .expect("write");
    let (id, kind, _) = read_message(&mut s, &Limits::default())
        .await
        .expect("read")
        .expect("an answer");
    assert_eq!((id, kind), (78, MessageKind::Response));
    server.shutdown().await;
}
