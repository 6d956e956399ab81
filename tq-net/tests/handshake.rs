//! The handshake: tokens, version mismatch (in both directions, bytes crafted by hand), and
//! clients that never send one.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic
mod common;

use common::{assert_closed_by_server, assert_serving, raw};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tq_core::ErrorKind;
use tq_net::{CallOptions, ClientConfig, Endpoint, Message, Pool, ServerConfig};

fn pool_with_token(token: Option<&str>) -> Pool {
    Pool::new(ClientConfig {
        token: token.map(str::to_owned),
        ..ClientConfig::default()
    })
}

fn secured() -> ServerConfig {
    ServerConfig {
        token: Some("s3cret-token".into()),
        name: "secured".into(),
        ..ServerConfig::default()
    }
}

#[tokio::test]
async fn the_right_token_is_accepted() {
    let server = common::serve(common::Echo, secured()).await;
    let peer = server.local_endpoint().clone();
    assert_serving(&pool_with_token(Some("s3cret-token")), &peer).await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_wrong_token_is_refused_with_a_clear_error() {
    let server = common::serve(common::Echo, secured()).await;
    let peer = server.local_endpoint().clone();
    for pool in [
        pool_with_token(Some("s3cret-tokeN")),
        pool_with_token(Some("x")),
    ] {
        // Even an idempotent call is not retried: a refusal will not change.
        let err = pool
            .call(&peer, Message::default(), CallOptions::idempotent())
            .await
            .expect_err("refused");
        assert_eq!(err.kind(), &ErrorKind::PermissionDenied);
        let text = err.to_string();
        assert!(text.contains("unauthorized: token rejected"), "{text}");
        assert!(text.contains(&peer.to_string()), "names the peer: {text}");
    }
    assert_eq!(server.connections_accepted(), 2, "no retry after a refusal");
    server.shutdown().await;
}

#[tokio::test]
async fn a_missing_token_is_refused_when_the_server_has_one() {
    let server = common::serve(common::Echo, secured()).await;
    let peer = server.local_endpoint().clone();
    let err = pool_with_token(None)
        .call(&peer, Message::default(), CallOptions::default())
        .await
        .expect_err("refused");
    let text = err.to_string();
    assert!(text.contains("unauthorized: token rejected"), "{text}");
    assert!(text.contains("none was presented"), "{text}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_server_without_a_token_accepts_any_client() {
    let server = common::serve(common::Echo, ServerConfig::default()).await;
    let peer = server.local_endpoint().clone();
    assert_serving(&pool_with_token(Some("whatever")), &peer).await;
    assert_serving(&pool_with_token(None), &peer).await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_newer_server_gives_the_client_a_clear_version_message() {
    // A hand-made "server" that speaks the next version and refuses this one.
    let ours = tq_net::PROTOCOL_VERSION;
    let newer = ours + 1;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let peer = Endpoint::Tcp(listener.local_addr().expect("addr").to_string());
    let fake = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accept");
        let mut hello = [0u8; 10];
        s.read_exact(&mut hello).await.expect("hello");
        assert_eq!(
            hello,
            [b'T', b'Q', b'N', b'E', b'T', ours, b'\r', b'\n', 0, 0],
            "client hello bytes"
        );
        let text = b"upgrade your client";
        let mut reply = b"TQNET".to_vec();
        reply.extend_from_slice(&[newer, 1]);
        reply.extend_from_slice(&(text.len() as u16).to_le_bytes());
        reply.extend_from_slice(text);
        s.write_all(&reply).await.expect("reply");
    });
    let err = common::pool()
        .call(&peer, Message::default(), CallOptions::idempotent())
        .await
        .expect_err("mismatch");
    assert_eq!(err.kind(), &ErrorKind::PermissionDenied);
    let expected =
        format!("peer {peer} speaks tq protocol version {newer}, this build speaks {ours}");
    assert!(err.message().contains(&expected), "{err}");
    assert!(err.message().contains("upgrade your client"), "{err}");
    fake.await.expect("fake server");
}

#[tokio::test]
async fn an_older_or_newer_client_gets_a_version_mismatch_reply_then_close() {
    let ours = tq_net::PROTOCOL_VERSION;
    let newer = ours + 1;
    let server = common::serve(common::Echo, ServerConfig::default()).await;
    let peer = server.local_endpoint().clone();
    let mut s = raw(&peer).await;
    // The next version, with a hello layout this server cannot know.
    let mut hello = b"TQNET".to_vec();
    hello.push(newer);
    hello.extend_from_slice(b"\x00\x00\x00\x00whatever-the-next-version-sends");
    s.write_all(&hello).await.expect("hello");
    let mut head = [0u8; 9];
    s.read_exact(&mut head).await.expect("reply");
    assert_eq!(&head[..5], b"TQNET");
    assert_eq!(head[5], ours);
    assert_eq!(head[6], 1, "status: version mismatch");
    let mut text = vec![0u8; u16::from_le_bytes([head[7], head[8]]) as usize];
    s.read_exact(&mut text).await.expect("message");
    let text = String::from_utf8(text).expect("utf-8");
    assert!(
        text.contains(&format!("version {ours}")) && text.contains(&newer.to_string()),
        "{text}"
    );
    assert_closed_by_server(&mut s, Duration::from_secs(3)).await;
    assert_serving(&common::pool(), &peer).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_neither_blocks_others_nor_lives_forever() {
    let server = common::serve(
        common::Echo,
        ServerConfig {
            handshake_timeout: Duration::from_secs(1),
            ..ServerConfig::default()
        },
    )
    .await;
    let peer = server.local_endpoint().clone();
    let mut silent = raw(&peer).await;
    let mut half = raw(&peer).await;
    half.write_all(b"TQN").await.expect("partial hello");
    let started = Instant::now();
    assert!(common::eventually(Duration::from_secs(2), || server.open_connections() == 2).await);
    // Others are served while the silent ones are still waiting in their handshakes.
    let pool = common::pool();
    assert_serving(&pool, &peer).await;
    assert_eq!(
        server.open_connections(),
        3,
        "silent connections still open while serving"
    );
    assert_closed_by_server(&mut silent, Duration::from_secs(5)).await;
    assert_closed_by_server(&mut half, Duration::from_secs(5)).await;
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "closed by the handshake timeout"
    );
    assert_serving(&pool, &peer).await;
    server.shutdown().await;
}
