//! Property tests of the framing: any message written is read back exactly, and any bytes a
//! peer sends are either a message or an error — never a panic, never an allocation beyond the
//! limits.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may panic
use bytes::Bytes;
use proptest::prelude::*;
use tq_net::frame::{read_message, write_message};
use tq_net::{Limits, Message, MessageKind};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

fn small_limits() -> Limits {
    Limits {
        max_header_bytes: 4096,
        max_frames: 64,
        max_body_bytes: 1 << 16,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn written_messages_read_back_exactly(
        request_id in any::<u64>(),
        kind in prop_oneof![Just(MessageKind::Request), Just(MessageKind::Response), Just(MessageKind::Error)],
        header in proptest::collection::vec(any::<u8>(), 0..256),
        frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..512), 0..8),
    ) {
        let message = Message::new(
            Bytes::from(header),
            frames.into_iter().map(Bytes::from).collect(),
        );
        let mut wire: Vec<u8> = Vec::new();
        runtime().block_on(async {
            write_message(&mut wire, request_id, kind, message.clone()).await.unwrap();
            let mut reader = &wire[..];
            let (id, k, back) = read_message(&mut reader, &small_limits())
                .await
                .unwrap()
                .expect("one message");
            prop_assert_eq!(id, request_id);
            prop_assert_eq!(k, kind);
            prop_assert!(back == message);
            prop_assert!(read_message(&mut reader, &small_limits()).await.unwrap().is_none());
            Ok(())
        })?;
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        runtime().block_on(async {
            let mut reader = &bytes[..];
            // Read until the input is exhausted or refused; each step is a message or an error.
            for _ in 0..16 {
                match read_message(&mut reader, &small_limits()).await {
                    Ok(Some((_, _, m))) => {
                        prop_assert!(m.header.len() <= 4096);
                        prop_assert!(m.body_len() <= 1 << 16);
                    }
                    Ok(None) | Err(_) => break,
                }
            }
            Ok(())
        })?;
    }

    #[test]
    fn a_valid_message_with_one_byte_changed_is_read_or_refused(
        header in proptest::collection::vec(any::<u8>(), 0..64),
        frame in proptest::collection::vec(any::<u8>(), 0..64),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let message = Message::new(Bytes::from(header), vec![Bytes::from(frame)]);
        runtime().block_on(async {
            let mut wire: Vec<u8> = Vec::new();
            write_message(&mut wire, 7, MessageKind::Request, message).await.unwrap();
            let i = at.index(wire.len());
            wire[i] = byte;
            let mut reader = &wire[..];
            let _ = read_message(&mut reader, &small_limits()).await;
        });
    }
}
