//! [`Resend`]: whether a request whose answer was lost may be sent again, declared once per
//! operation in each RPC plane's operation table (the controller's and the storage unit's).

/// How a remote stub may send an operation again when its answer was lost (a dropped
/// connection, a restart of the peer). Declared once per operation where the operation is
/// declared, so the rule sits beside the operation instead of at each call site.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resend {
    /// Applying it twice is the same as applying it once: the transport resends it freely.
    Freely,
    /// Never resent: a second application could do harm (hand samples out twice, merge a
    /// value twice).
    Never,
    /// Resent under a request id, so the peer applies it once however often it arrives and
    /// answers a repeat with the first answer (the controller's `get_meta_once`).
    Tagged,
}
