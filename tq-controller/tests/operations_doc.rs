//! docs/operations.md cannot drift from the code: its paragraph of controller `op_type`s names
//! exactly the operations of [`ControllerOp::ALL`], each once, so an operation added to the
//! table without its documentation (or documentation of an operation that is gone) fails here.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and examples may panic

use std::collections::BTreeSet;
use std::path::Path;
use tq_controller::ControllerOp;

/// The backticked UPPER_CASE names between `from` and `to` in `text`.
fn op_names(text: &str, from: &str, to: &str) -> Vec<String> {
    let start = text
        .find(from)
        .unwrap_or_else(|| panic!("docs/operations.md has no `{from}`"));
    let rest = &text[start + from.len()..];
    let end = rest
        .find(to)
        .unwrap_or_else(|| panic!("docs/operations.md has no `{to}` after `{from}`"));
    rest[..end]
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .map(str::to_string)
        .collect()
}

#[test]
fn operations_md_lists_exactly_the_controller_operations() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let documented = op_names(&text, "Controller `op_type`s:", "Storage `op_type`s:");
    let unique: BTreeSet<&String> = documented.iter().collect();
    assert_eq!(
        unique.len(),
        documented.len(),
        "an operation is listed twice: {documented:?}"
    );
    let documented: BTreeSet<String> = documented.into_iter().collect();
    let table: BTreeSet<String> = ControllerOp::ALL
        .iter()
        .map(|op| op.name().to_string())
        .collect();
    let missing: Vec<_> = table.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&table).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/operations.md's controller op_types differ from ControllerOp::ALL: \
         not documented {missing:?}, documented but not operations {stale:?}"
    );
}
