//! The blocking traits cannot drift from the async ones: every method of `Checkpoints` and
//! `Dumps` has a method of the same name in `BlockingCheckpoints` and `BlockingDumps`, and no
//! other. The test reads the crate's sources, like tq-client's own parity test.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic

use std::collections::BTreeSet;
use std::path::Path;

/// The method names declared in `pub trait <name> { ... }` of `file` (under `src/`).
fn trait_methods(file: &str, name: &str) -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(file);
    let source = std::fs::read_to_string(&path).unwrap();
    let start = source
        .find(&format!("pub trait {name} {{"))
        .unwrap_or_else(|| panic!("{file} declares no trait {name}"));
    let body = &source[start..];
    let body = &body[..body.find("\n}\n").unwrap()];
    body.lines()
        .filter_map(|l| l.trim_start().strip_prefix("fn "))
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

#[test]
fn every_async_method_has_a_blocking_counterpart() {
    for (file, asynchronous, blocking) in [
        ("checkpoint.rs", "Checkpoints", "BlockingCheckpoints"),
        ("dump.rs", "Dumps", "BlockingDumps"),
    ] {
        let a = trait_methods(file, asynchronous);
        let b = trait_methods("blocking.rs", blocking);
        assert!(a.len() >= 2, "{asynchronous}: {a:?}");
        assert_eq!(a, b, "{asynchronous} and {blocking} differ");
    }
}
