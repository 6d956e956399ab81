//! Property tests of the handshake against a live server: whatever bytes a peer opens with
//! (arbitrary, or a valid hello with one byte changed), the server answers or closes that one
//! connection and goes on serving everyone else; it never panics or hangs on it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
mod common;

use proptest::prelude::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tq_net::handshake::client_hello;
use tq_net::{ServerConfig, PROTOCOL_VERSION};

/// Sends `opening` on a fresh connection, reads whatever comes back until the server closes
/// or a second passes, then checks that a real client is still served.
fn survives(opening: Vec<u8>) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let server = common::serve(
            common::Echo,
            ServerConfig {
                handshake_timeout: Duration::from_millis(300),
                ..ServerConfig::default()
            },
        )
        .await;
        let peer = server.local_endpoint().clone();
        let mut s = common::raw(&peer).await;
        let _ = s.write_all(&opening).await;
        let mut sink = vec![0u8; 4096];
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while let Ok(n) = s.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
        common::assert_serving(&common::pool(), &peer).await;
        server.shutdown().await;
    });
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn arbitrary_openings_never_take_the_server_down(
        opening in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        survives(opening)?;
    }

    #[test]
    fn a_valid_hello_with_one_byte_changed_is_answered_or_refused(
        token in proptest::collection::vec(any::<u8>(), 0..32),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut hello = client_hello(PROTOCOL_VERSION, &token).unwrap();
        let i = at.index(hello.len());
        hello[i] = byte;
        survives(hello)?;
    }
}
