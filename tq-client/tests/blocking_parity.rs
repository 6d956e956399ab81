//! `BlockingClient` cannot drift from `Client`: every public async operation of `Client`,
//! `Partition` and `BatchStream` must have a blocking method of the same name on
//! `BlockingClient`, `BlockingPartition` and `BlockingBatchStream`. The test reads the crate's
//! sources, so adding an async operation without its blocking counterpart fails here.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `impl <Type> {` blocks and the `pub async fn` / `pub fn` names inside them, per type.
fn public_methods(source: &str, asynchronous: bool) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in source.lines() {
        if let Some(rest) = line.strip_prefix("impl ") {
            // `impl Client {`, not `impl Trait for Type {` (trait methods are not inherent).
            current = rest
                .strip_suffix(" {")
                .filter(|t| !t.contains(" for ") && !t.contains('<'))
                .map(str::to_string);
            continue;
        }
        if line.starts_with('}') {
            current = None;
            continue;
        }
        let Some(ty) = &current else { continue };
        let prefix = if asynchronous {
            "    pub async fn "
        } else {
            "    pub fn "
        };
        if let Some(rest) = line.strip_prefix(prefix) {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.entry(ty.clone()).or_default().insert(name);
        }
    }
    out
}

#[test]
fn every_async_operation_has_a_blocking_counterpart() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut asynchronous: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.file_name().unwrap() == "blocking.rs"
                || path.extension().is_none_or(|e| e != "rs")
            {
                continue;
            }
            for (ty, names) in public_methods(&std::fs::read_to_string(&path).unwrap(), true) {
                asynchronous.entry(ty).or_default().extend(names);
            }
        }
    }
    let blocking = public_methods(
        &std::fs::read_to_string(src.join("blocking.rs")).unwrap(),
        false,
    );
    let pairs = [
        ("Client", "BlockingClient"),
        ("Partition", "BlockingPartition"),
        ("BatchStream", "BlockingBatchStream"),
    ];
    for (ty, _) in &pairs {
        assert!(
            asynchronous.get(*ty).is_some_and(|n| !n.is_empty()),
            "found no async operations of {ty}: the source scan is broken ({asynchronous:?})"
        );
    }
    let mut missing = Vec::new();
    for (ty, blocking_ty) in pairs {
        let have = blocking.get(blocking_ty).cloned().unwrap_or_default();
        for name in &asynchronous[ty] {
            if !have.contains(name) {
                missing.push(format!("{ty}::{name} has no {blocking_ty}::{name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "blocking API drifted:\n{}",
        missing.join("\n")
    );
}
