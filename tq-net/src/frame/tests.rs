use super::*;

fn sample() -> Message {
    Message::new(
        Bytes::from_static(b"hdr"),
        vec![
            Bytes::from_static(b"one"),
            Bytes::new(),
            Bytes::from(vec![7u8; 100_000]),
        ],
    )
}

async fn wire_of(message: Message) -> Vec<u8> {
    let mut wire = Vec::new();
    write_message(&mut wire, 7, MessageKind::Response, message)
        .await
        .expect("write");
    wire
}

#[tokio::test]
async fn frames_land_in_the_buffers_that_fit_them() {
    let wire = wire_of(sample()).await;
    let mut r = &wire[..];
    let head = read_head(&mut r, &Limits::default())
        .await
        .expect("head")
        .expect("message");
    // Frame 0 fits its buffer; frame 2's buffer is one byte short; frame 1 gets none.
    // A fourth buffer has no frame at all.
    let mut place = vec![
        Some(BytesMut::zeroed(3)),
        None,
        Some(BytesMut::zeroed(99_999)),
        Some(BytesMut::zeroed(3)),
    ];
    let msg = read_body(&mut r, &head, &mut place, BodyBuffer::Fresh)
        .await
        .expect("body");
    assert!(r.is_empty(), "the whole message was consumed");
    assert_eq!(place[0].as_deref().expect("placed"), b"one");
    assert!(place[1].is_none() && place[2].is_none() && place[3].is_none());
    assert_eq!(msg.header, Bytes::from_static(b"hdr"));
    assert!(
        msg.frames[0].is_empty(),
        "a placed frame is not also in the message"
    );
    assert_eq!(msg.frames[2], sample().frames[2]);
}

#[tokio::test]
async fn a_message_cut_inside_a_placed_frame_is_truncated() {
    let wire = wire_of(sample()).await;
    let cut = &wire[..wire.len() - 10];
    let mut r = cut;
    let head = read_head(&mut r, &Limits::default())
        .await
        .expect("head")
        .expect("message");
    let mut place = vec![None, None, Some(BytesMut::zeroed(100_000))];
    let err = read_body(&mut r, &head, &mut place, BodyBuffer::Fresh)
        .await
        .unwrap_err();
    assert!(
        matches!(err, FrameError::Truncated { part: "body", .. }),
        "{err}"
    );
}

#[tokio::test]
async fn an_answer_read_into_pooled_memory_keeps_every_frame_and_reuses_the_buffer() {
    // Over POOL_MIN_BYTES, so the body comes from the pool; each round gives it back.
    let message = || {
        Message::new(
            Bytes::from_static(b"hdr"),
            (0..80u8).map(|i| Bytes::from(vec![i; 1024])).collect(),
        )
    };
    let wire = wire_of(message()).await;
    let pool = tq_core::buffer::BufferPool::global();
    for round in 0..2 {
        let mut r = &wire[..];
        let head = read_head(&mut r, &Limits::default())
            .await
            .expect("head")
            .expect("message");
        let msg = read_body(&mut r, &head, &mut [], BodyBuffer::Pooled)
            .await
            .expect("body");
        assert!(
            r.is_empty(),
            "round {round}: the whole message was consumed"
        );
        assert_eq!(msg.header, Bytes::from_static(b"hdr"));
        assert_eq!(msg.frames, message().frames, "round {round}");
        drop(msg);
        assert!(
            pool.held_bytes() >= 80 * 1024,
            "round {round}: the body's buffer went back to the pool"
        );
    }
    // A pooled body cut short is an error that says how much arrived, as a growing one is.
    let cut = &wire[..wire.len() - 10];
    let mut r = cut;
    let head = read_head(&mut r, &Limits::default())
        .await
        .expect("head")
        .expect("message");
    let err = read_body(&mut r, &head, &mut [], BodyBuffer::Pooled)
        .await
        .unwrap_err();
    assert!(
        matches!(err, FrameError::Truncated { part: "body", expected, received } if expected == received + 10),
        "{err}"
    );
}

#[tokio::test]
async fn round_trip_through_a_pipe_keeps_everything() {
    let (mut a, mut b) = tokio::io::duplex(4096);
    let writer = tokio::spawn(async move {
        write_message(&mut a, 42, MessageKind::Response, sample())
            .await
            .expect("write");
        write_message(&mut a, 43, MessageKind::Request, Message::default())
            .await
            .expect("write");
    });
    let limits = Limits::default();
    let (id, kind, msg) = read_message(&mut b, &limits)
        .await
        .expect("read")
        .expect("message");
    assert_eq!((id, kind), (42, MessageKind::Response));
    assert_eq!(msg, sample());
    let (id, kind, msg) = read_message(&mut b, &limits)
        .await
        .expect("read")
        .expect("message");
    assert_eq!((id, kind), (43, MessageKind::Request));
    assert_eq!(msg, Message::default());
    writer.await.expect("writer");
    assert!(read_message(&mut b, &limits).await.expect("eof").is_none());
}

#[test]
fn prefix_layout_is_as_documented() {
    let p = Prefix {
        request_id: 0x0102030405060708,
        kind: 2,
        header_len: 0x11223344,
        frame_count: 5,
        trace_id: 0xa1b2c3d4,
    };
    let b = p.to_bytes();
    assert_eq!(&b[0..8], &[8, 7, 6, 5, 4, 3, 2, 1]);
    assert_eq!(b[8], 2);
    assert_eq!(&b[9..12], &[0, 0, 0]);
    assert_eq!(&b[12..16], &[0x44, 0x33, 0x22, 0x11]);
    assert_eq!(&b[16..20], &[5, 0, 0, 0]);
    assert_eq!(&b[20..24], &[0xd4, 0xc3, 0xb2, 0xa1]);
    assert_eq!(Prefix::parse(&b).expect("parse"), p);
    let mut bad = b;
    bad[10] = 1;
    assert!(matches!(Prefix::parse(&bad), Err(FrameError::Malformed(_))));
}

#[tokio::test]
async fn limits_are_checked_before_reading_the_body() {
    let limits = Limits {
        max_header_bytes: 10,
        max_frames: 4,
        max_body_bytes: 1000,
    };
    let cases = [(11u32, 0u32, 0u64), (0, 5, 0), (0, 1, 1001)];
    for (header_len, frame_count, frame_len) in cases {
        let mut wire = Prefix {
            request_id: 1,
            kind: 0,
            header_len,
            frame_count,
            trace_id: 9,
        }
        .to_bytes()
        .to_vec();
        if frame_count == 1 {
            wire.extend_from_slice(&frame_len.to_le_bytes());
        }
        // No body follows: a reader that tried to read it would report truncation instead.
        let err = read_message(&mut &wire[..], &limits)
            .await
            .expect_err("over limit");
        assert!(
            matches!(err, FrameError::LimitExceeded(_)),
            "{header_len}/{frame_count}/{frame_len}: {err}"
        );
    }
}

#[tokio::test]
async fn truncation_is_reported_per_part() {
    let limits = Limits::default();
    let full = {
        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        write_message(&mut a, 9, MessageKind::Request, sample())
            .await
            .expect("write");
        drop(a);
        let mut v = Vec::new();
        b.read_to_end(&mut v).await.expect("read");
        v
    };
    for cut in [1, PREFIX_LEN + 3, full.len() - 1] {
        let err = read_message(&mut &full[..cut], &limits)
            .await
            .expect_err("truncated");
        assert!(matches!(err, FrameError::Truncated { .. }), "{cut}: {err}");
    }
}

#[tokio::test]
async fn vectored_writer_survives_many_slices_and_partial_writes() {
    // 3000 small frames (more than MAX_IO_SLICES) through a tiny pipe that forces partial
    // writes.
    let frames: Vec<Bytes> = (0..3000u32)
        .map(|i| Bytes::from(i.to_le_bytes().to_vec()))
        .collect();
    let msg = Message::new(Bytes::from_static(b"h"), frames);
    let expected = msg.clone();
    let (mut a, mut b) = tokio::io::duplex(37);
    let writer = tokio::spawn(async move {
        write_message(&mut a, 1, MessageKind::Request, msg)
            .await
            .expect("write");
    });
    let (_, _, got) = read_message(&mut b, &Limits::default())
        .await
        .expect("read")
        .expect("message");
    assert_eq!(got, expected);
    writer.await.expect("writer");
}
