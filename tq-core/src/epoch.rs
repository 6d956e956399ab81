//! Controller epochs: which life of a controller's state metadata belongs to.
//!
//! A controller that starts without its state starts a new epoch. Everything that addresses
//! samples — requests to the controller and to storage units, and KV keys — carries the epoch
//! it was made in, so metadata from an earlier epoch (whose index `(0, 0)` names another
//! sample now) can never read, overwrite or clear a sample of the new one.

use crate::Error;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// A fresh epoch: random, never 0 (0 means "not known yet" on the wire).
pub fn new_epoch() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish().max(1)
}

/// The error for a request made in epoch `theirs` reaching a component at epoch `ours`.
/// Never retryable: the metadata it carries describes a state that is gone.
pub fn epoch_mismatch(component: &str, theirs: u64, ours: u64) -> Error {
    Error::conflict(format!(
        "{component}: the controller restarted without its state — this request belongs to \
         epoch {theirs:016x}, {component} is at epoch {ours:016x}; metadata of the earlier \
         epoch is void (nothing of the new epoch was touched): connect a new client and \
         produce the data again"
    ))
    .with_retry(crate::Retry::Never)
}
