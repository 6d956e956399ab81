//! The facade's features cannot drift from tq-client's: every feature of tq-client is a
//! feature of `tq` with the same name that turns it on (`"tq-client/<name>"`), so a backend
//! added to the client is reachable from the one crate downstream projects depend on; the same
//! for tq-checkpoint (checkpoints and dumps in object stores).
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic

use std::collections::BTreeMap;
use std::path::Path;

/// The `[features]` table of the manifest at `path` (relative to this crate): name → entries.
fn features(path: &str) -> BTreeMap<String, Vec<String>> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    let text = std::fs::read_to_string(&file).unwrap();
    let mut out = BTreeMap::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == "[features]";
            continue;
        }
        if !inside || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, list) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{path}: `{line}`"));
        let entries = list
            .trim()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .split(',')
            .map(|e| e.trim().trim_matches('"').to_string())
            .filter(|e| !e.is_empty())
            .collect();
        out.insert(name.trim().to_string(), entries);
    }
    assert!(!out.is_empty(), "{path} has no [features] table");
    out
}

#[test]
fn every_client_feature_is_a_facade_feature_that_enables_it() {
    let facade = features("Cargo.toml");
    let client = features("../tq-client/Cargo.toml");
    for name in client.keys().filter(|n| *n != "default") {
        let Some(entries) = facade.get(name) else {
            panic!("tq-client has feature `{name}` and the `tq` facade does not");
        };
        let forward = format!("tq-client/{name}");
        assert!(
            entries.contains(&forward),
            "the facade's feature `{name}` does not enable `{forward}`: {entries:?}"
        );
    }
    assert_eq!(
        facade["default"], client["default"],
        "the default features differ"
    );
}

#[test]
fn every_checkpoint_feature_is_a_facade_feature_that_enables_it() {
    let facade = features("Cargo.toml");
    let checkpoint = features("../tq-checkpoint/Cargo.toml");
    for name in checkpoint.keys().filter(|n| *n != "default") {
        let forward = format!("tq-checkpoint/{name}");
        let entries = facade.get(name).unwrap_or_else(|| {
            panic!("tq-checkpoint has feature `{name}` and the `tq` facade does not")
        });
        assert!(
            entries.contains(&forward),
            "the facade's feature `{name}` does not enable `{forward}`: {entries:?}"
        );
    }
}
