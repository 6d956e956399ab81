//! The controller protocol's requests are pinned by committed bytes: one example of every
//! request, encoded as the current protocol version encodes it, in
//! `tests/data/control-requests-protocol<version>.hex`. A change to the request enum (its
//! order, a field's type or place, a new operation) that would make a peer of the same
//! protocol version misread a request fails here; such a change needs a new protocol version
//! (`tq_net::PROTOCOL_VERSION`), and then `TQ_BLESS_WIRE=1` writes the new version's file.
//! Every operation of the table must have its example here. Answers whose layout is written by
//! hand (a `BatchMeta`'s) are pinned the same way, in `control-answers-protocol<version>.hex`.

#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use std::collections::BTreeMap;
use tq_core::{BatchMeta, DType, FieldMeta, SampleId, TagValue, Tags};

fn examples() -> Vec<(&'static str, ControlRequest)> {
    let partition = || "train".to_string();
    let samples = || vec![SampleId::new(3, 1), SampleId::new(70_000, 9)];
    let fields = || vec!["input_ids".to_string(), "reward".to_string()];
    let keys = || vec!["k0".to_string(), "k1".to_string()];
    let schemas = || {
        BTreeMap::from([
            (
                "input_ids".to_string(),
                FieldMeta::dense(DType::I64, vec![4]),
            ),
            ("text".to_string(), FieldMeta::object()),
        ])
    };
    let tags = || {
        vec![
            Tags::from([("score".to_string(), TagValue::Float(0.5))]),
            Tags::new(),
        ]
    };
    let fetch = GetMetaRequest::fetch(
        "train",
        &["input_ids"],
        "actor",
        8,
        Wait::For(Duration::from_millis(250)),
    )
    .with_lease(Duration::from_secs(30))
    .with_rank(1, 7)
    .with_sampler("grpo")
    .with_sampler_args(vec![1, 2, 3]);
    vec![
        ("get_meta", ControlRequest::from_example_get_meta(fetch)),
        (
            "get_meta_force",
            ControlRequest::from_example_get_meta(GetMetaRequest {
                mode: GetMetaMode::Force,
                ..GetMetaRequest::fetch("train", &["input_ids"], "actor", 1, Wait::NoWait)
            }),
        ),
        (
            "notify",
            ControlRequest::from_example_notify(ProductionNotice {
                partition: partition(),
                samples: samples(),
                schemas: schemas(),
                tags: Some(tags()),
                backend_meta: Some(vec![
                    BackendMeta::from([("input_ids".to_string(), Bytes::from_static(b"at"))]),
                    BackendMeta::new(),
                ]),
            }),
        ),
        (
            "set_tags",
            ControlRequest::SetTags {
                partition: partition(),
                samples: samples(),
                tags: tags(),
            },
        ),
        (
            "mark_clearing",
            ControlRequest::MarkClearing {
                partition: partition(),
                samples: Some(samples()),
            },
        ),
        (
            "mark_clearing_all",
            ControlRequest::MarkClearing {
                partition: partition(),
                samples: None,
            },
        ),
        (
            "release",
            ControlRequest::Release {
                partition: partition(),
                samples: samples(),
            },
        ),
        (
            "begin_clear_fields",
            ControlRequest::BeginClearFields {
                partition: partition(),
                samples: samples(),
                fields: fields(),
            },
        ),
        (
            "finish_clear_fields",
            ControlRequest::FinishClearFields {
                partition: partition(),
                samples: samples(),
                fields: fields(),
            },
        ),
        (
            "kv_retrieve_meta",
            ControlRequest::KvRetrieveMeta {
                partition: partition(),
                keys: keys(),
                create: true,
            },
        ),
        (
            "kv_list",
            ControlRequest::KvList {
                partition: Some(partition()),
            },
        ),
        (
            "production_status",
            ControlRequest::ProductionStatus {
                partition: partition(),
                fields: fields(),
            },
        ),
        (
            "consumption_status",
            ControlRequest::ConsumptionStatus {
                partition: partition(),
                task: "actor".into(),
            },
        ),
        (
            "reset_consumption",
            ControlRequest::ResetConsumption {
                partition: partition(),
                task: Some("actor".into()),
            },
        ),
        (
            "list_partitions",
            ControlRequest::from_example_list_partitions(),
        ),
        (
            "ack",
            ControlRequest::Ack {
                partition: partition(),
                task: "actor".into(),
                lease: 0xfeed_beef,
                samples: samples(),
            },
        ),
        (
            "renew_lease",
            ControlRequest::RenewLease {
                partition: partition(),
                task: "actor".into(),
                lease: 0xfeed_beef,
                samples: samples(),
                extend: Duration::from_millis(90_500),
            },
        ),
        (
            "mark_complete",
            ControlRequest::MarkComplete {
                partition: partition(),
            },
        ),
        (
            "return_fetched",
            ControlRequest::ReturnFetched {
                partition: partition(),
                task: "actor".into(),
                lease: Some(5),
                samples: samples(),
            },
        ),
        (
            "drop_partition",
            ControlRequest::DropPartition {
                partition: partition(),
            },
        ),
        (
            "kv_link",
            ControlRequest::from_example_kv_link(LinkRequest {
                partition: partition(),
                keys: keys(),
                public_partition: "__public__".into(),
                public_keys: vec!["p0".into(), "p1".into()],
                fields: fields(),
            }),
        ),
        (
            "kv_unlink",
            ControlRequest::KvUnlink {
                partition: partition(),
                keys: keys(),
                fields: fields(),
            },
        ),
        (
            "mark_unlinked_public",
            ControlRequest::MarkUnlinkedPublic {
                public_partition: "__public__".into(),
                prefix: "img/".into(),
            },
        ),
        (
            "prepare_write",
            ControlRequest::PrepareWrite {
                partition: partition(),
                samples: samples(),
                fields: schemas(),
            },
        ),
        (
            "kv_prepare_put",
            ControlRequest::KvPreparePut {
                partition: partition(),
                keys: keys(),
                fields: schemas(),
            },
        ),
        (
            "kv_mark_clearing",
            ControlRequest::KvMarkClearing {
                partition: partition(),
                keys: keys(),
            },
        ),
        (
            "still_hold",
            ControlRequest::StillHold {
                partition: partition(),
                samples: samples(),
                fields: fields(),
            },
        ),
        (
            "register_unit",
            ControlRequest::RegisterUnit(UnitInfo {
                id: "unit-0".into(),
                endpoint: "tcp://127.0.0.1:7001".into(),
                instance: 11,
                registration: 2,
            }),
        ),
        ("topology", ControlRequest::Topology),
        ("status", ControlRequest::Status),
        ("snapshot", ControlRequest::Snapshot),
        ("restore", ControlRequest::Restore),
        (
            "snapshot_holding_removals",
            ControlRequest::SnapshotHoldingRemovals { ttl_ms: 600_000 },
        ),
        (
            "release_removals",
            ControlRequest::ReleaseRemovals { hold: 42 },
        ),
    ]
}

fn encoded() -> String {
    hex_lines(examples().into_iter().map(|(name, request)| {
        let envelope = ControlEnvelope {
            epoch: 0x0123_4567_89ab_cdef,
            request,
            once: Some(RequestId {
                client: 77,
                seq: 5,
                done_below: 4,
            }),
        };
        (name, postcard::to_allocvec(&envelope).unwrap())
    }))
}

/// The lines of a pin file: `name hex` per encoded message.
fn hex_lines(messages: impl Iterator<Item = (&'static str, Vec<u8>)>) -> String {
    let mut text = String::new();
    for (name, bytes) in messages {
        text.push_str(name);
        text.push(' ');
        for b in bytes {
            text.push_str(&format!("{b:02x}"));
        }
        text.push('\n');
    }
    text
}

#[test]
fn every_operation_of_the_table_has_an_example() {
    let covered: std::collections::BTreeSet<&str> =
        examples().iter().map(|(_, r)| r.op().name()).collect();
    let missing: Vec<&str> = ControllerOp::ALL
        .iter()
        .map(|op| op.name())
        .filter(|name| !covered.contains(name) && *name != "UNDECODABLE")
        .collect();
    assert!(
        missing.is_empty(),
        "no wire example for {missing:?}: add one to examples()"
    );
}

#[test]
fn every_controller_request_encodes_as_this_protocol_version_does() {
    check_pinned("control-requests", &encoded(), |bytes| {
        postcard::from_bytes::<ControlEnvelope>(bytes).map(drop)
    });
}

/// Answers whose layout is not the plain derive of their types: a [`BatchMeta`] (its per-row
/// maps as the rows that have one, production as one flag when every row agrees; tq-core's
/// `meta/wire.rs`) alone and inside a key lookup's answer.
fn answer_examples() -> Vec<(&'static str, ControlResponse)> {
    let samples = vec![
        SampleId::new(3, 1),
        SampleId::new(70_000, 9),
        SampleId::new(4, 0),
    ];
    let fields = BTreeMap::from([(
        "input_ids".to_string(),
        FieldMeta::dense(DType::I64, vec![4]),
    )]);
    let mut tags = vec![Tags::new(); 3];
    tags[1].insert("score".to_string(), TagValue::Float(0.5));
    let mut backend_meta = vec![BackendMeta::new(); 3];
    backend_meta[2].insert("input_ids".to_string(), Bytes::from_static(b"at"));
    let mut links = vec![tq_core::Links::new(); 3];
    links[0].insert("input_ids".to_string(), SampleId::new(9, 2));
    let mixed = BatchMeta::from_parts(tq_core::BatchMetaParts {
        partition: "train".to_string(),
        samples: samples.clone(),
        fields: fields.clone(),
        production: vec![true, false, true],
        tags,
        backend_meta,
        lease: Some(42),
        links,
    })
    .unwrap();
    let plain = BatchMeta::new("train", samples)
        .with_fields(fields)
        .unwrap()
        .with_production(vec![true; 3])
        .unwrap();
    vec![
        ("meta_mixed", ControlResponse::Meta(mixed)),
        ("meta_plain", ControlResponse::Meta(plain.clone())),
        (
            "meta_empty",
            ControlResponse::Meta(BatchMeta::empty("train")),
        ),
        (
            "kv_meta",
            ControlResponse::KvMeta(KvMeta {
                meta: plain,
                keys: vec!["k0".into(), "k1".into(), "k2".into()],
                missing: vec!["k9".into()],
                clearing: Vec::new(),
            }),
        ),
    ]
}

#[test]
fn batch_meta_answers_encode_as_this_protocol_version_does() {
    let now = hex_lines(
        answer_examples()
            .into_iter()
            .map(|(name, answer)| (name, postcard::to_allocvec(&answer).unwrap())),
    );
    check_pinned("control-answers", &now, |bytes| {
        postcard::from_bytes::<ControlResponse>(bytes).map(drop)
    });
}

/// Compares `now` (lines of `name hex`) with `tests/data/<stem>-protocol<version>.hex`, and
/// checks that every pinned line still decodes; `TQ_BLESS_WIRE=1` writes the file first.
fn check_pinned(stem: &str, now: &str, decode: impl Fn(&[u8]) -> postcard::Result<()>) {
    let version = tq_net::PROTOCOL_VERSION;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/data/{stem}-protocol{version}.hex"));
    if std::env::var_os("TQ_BLESS_WIRE").is_some() {
        std::fs::write(&path, now).unwrap();
    }
    let pinned = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; a new protocol version writes its file with TQ_BLESS_WIRE=1",
            path.display()
        )
    });
    for (want, got) in pinned.lines().zip(now.lines()) {
        assert_eq!(
            got, want,
            "{stem}: a message no longer encodes as protocol {version} did"
        );
    }
    assert_eq!(
        pinned.lines().count(),
        now.lines().count(),
        "{stem}: messages added or removed"
    );
    for line in pinned.lines() {
        let (name, hex) = line.split_once(' ').unwrap();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        decode(&bytes).unwrap_or_else(|e| panic!("{stem}: pinned `{name}` does not decode: {e}"));
    }
}

/// The requests whose variant shape the operation table decides, built the way it does.
impl ControlRequest {
    fn from_example_get_meta(req: GetMetaRequest) -> Self {
        ControlRequest::GetMeta { req }
    }
    fn from_example_notify(notice: ProductionNotice) -> Self {
        ControlRequest::Notify { notice }
    }
    fn from_example_list_partitions() -> Self {
        ControlRequest::ListPartitions {}
    }
    fn from_example_kv_link(req: LinkRequest) -> Self {
        ControlRequest::KvLink { req }
    }
}
