//! The one public error type of tq (docs/architecture.md, "Data model (tq-core)"; retry status:
//! decision 0007).
//!
//! Every crate reports failures as [`Error`]: a coarse, matchable [`ErrorKind`] plus a message that
//! names the partition, key, field, sample or storage unit involved.

use std::fmt;

/// Result alias used across tq.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, coarsely. Callers match on this; the message carries the details.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad input: duplicate keys, empty lists, length mismatches, unknown fields, type conflicts.
    /// Nothing was changed.
    Invalid,
    /// A partition, key, sample or cell that does not exist.
    NotFound,
    /// The request collides with the current state (sample being cleared, stale generation, ...).
    Conflict,
    /// A storage unit has no room for the new samples. Nothing was written.
    CapacityExceeded,
    /// Metadata says a cell exists but storage does not hold it.
    DataLost,
    /// The backend cannot do this operation.
    Unsupported {
        /// The operation that was refused (`"update"`, `"link"`, ...).
        operation: String,
        /// The backend that refused it.
        backend: String,
    },
    /// A deadline passed before an answer arrived.
    Timeout,
    /// A component (storage unit, controller, server) cannot be reached.
    Unavailable,
    /// Stored or received bytes do not decode.
    Corrupted,
    /// A peer refused us: wrong or missing token, or a protocol version it does not speak.
    /// Not retryable: repeating the request cannot succeed.
    PermissionDenied,
    /// The client or component was shut down.
    Closed,
    /// A bug in tq: an invariant did not hold.
    Internal,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Invalid => f.write_str("invalid input"),
            ErrorKind::NotFound => f.write_str("not found"),
            ErrorKind::Conflict => f.write_str("conflict"),
            ErrorKind::CapacityExceeded => f.write_str("capacity exceeded"),
            ErrorKind::DataLost => f.write_str("data lost"),
            ErrorKind::Unsupported { operation, backend } => {
                write!(
                    f,
                    "operation `{operation}` unsupported by backend `{backend}`"
                )
            }
            ErrorKind::Timeout => f.write_str("timeout"),
            ErrorKind::Unavailable => f.write_str("unavailable"),
            ErrorKind::Corrupted => f.write_str("corrupted"),
            ErrorKind::PermissionDenied => f.write_str("permission denied"),
            ErrorKind::Closed => f.write_str("closed"),
            ErrorKind::Internal => f.write_str("internal error"),
        }
    }
}

/// Whether repeating the request that failed is safe, set where the error is made.
///
/// The kind says what went wrong; this says what a caller may do about it. They differ for a
/// timeout: a read that timed out can simply be repeated, while an update, a fetch or an insert
/// that timed out after it was sent may already have been applied, and repeating it would apply
/// a merge twice, consume samples twice or allocate twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Retry {
    /// Nothing took effect (or the request is idempotent); the same request may succeed later.
    Safe,
    /// The request may or may not have taken effect (a timeout or a lost connection after it
    /// was sent). Check the state before repeating it.
    OutcomeUnknown,
    /// Repeating the same request cannot succeed.
    Never,
}

impl Retry {
    /// The status an error of `kind` has unless the place that makes it knows better: a
    /// timeout is `OutcomeUnknown` (the deadline passed, the peer may have acted), an
    /// unreachable component `Safe`, everything else `Never`.
    pub fn default_for(kind: &ErrorKind) -> Retry {
        match kind {
            ErrorKind::Timeout => Retry::OutcomeUnknown,
            ErrorKind::Unavailable => Retry::Safe,
            _ => Retry::Never,
        }
    }
}

impl fmt::Display for Retry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Retry::Safe => "safe to retry",
            Retry::OutcomeUnknown => "outcome unknown",
            Retry::Never => "not retryable",
        })
    }
}

/// The public tq error: a kind, a message naming what was involved, whether a retry is safe,
/// and an optional cause.
#[derive(Debug, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    retry: Retry,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    /// A new error of `kind`, with the kind's default [`Retry`] status
    /// ([`Retry::default_for`]); see [`Error::with_retry`].
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            retry: Retry::default_for(&kind),
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// Sets the retry status: the place that makes an error knows whether the request was
    /// sent and whether it is idempotent.
    pub fn with_retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// Whether and how the failed request may be repeated.
    pub fn retry(&self) -> Retry {
        self.retry
    }

    /// Attaches the underlying cause.
    pub fn with_source(
        mut self,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        self.source = Some(source.into());
        self
    }

    /// The coarse kind, for matching.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// The human-readable message (without the kind prefix).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// True when repeating the same request later is safe and may succeed: exactly when
    /// [`Error::retry`] is [`Retry::Safe`]. A timed-out update is *not* retryable this way
    /// ([`Retry::OutcomeUnknown`]): it may have been applied.
    pub fn is_retryable(&self) -> bool {
        self.retry == Retry::Safe
    }

    /// The name of the `subject` this error is about, as its message names it:
    /// messages follow one convention, `partition `train``, `key `k1``, `field `x``,
    /// `unit `u0``, and this reads the first of that subject back. The name travels in the
    /// message, so it survives the wire and context prefixes; `None` when the message names
    /// no such subject.
    pub fn subject(&self, subject: Subject) -> Option<&str> {
        let marker = subject.marker();
        let mut rest = self.message.as_str();
        let mut offset = 0;
        while let Some(found) = rest.find(marker) {
            let at = offset + found;
            let starts_word = self.message[..at]
                .chars()
                .next_back()
                .is_none_or(|c| !c.is_alphanumeric() && c != '_');
            let name_start = at + marker.len();
            if let Some(len) = self.message[name_start..].find('`') {
                if starts_word {
                    return Some(&self.message[name_start..name_start + len]);
                }
            }
            offset = name_start;
            rest = &self.message[name_start..];
        }
        None
    }

    /// Prefixes the message with context (`"partition `train`: "`), keeping kind and source.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, message)
    }
    pub fn capacity_exceeded(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::CapacityExceeded, message)
    }
    pub fn data_lost(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::DataLost, message)
    }
    pub fn unsupported(operation: impl Into<String>, backend: impl Into<String>) -> Self {
        let (operation, backend) = (operation.into(), backend.into());
        let message = format!("backend `{backend}` does not support `{operation}`");
        Self::new(ErrorKind::Unsupported { operation, backend }, message)
    }
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Timeout, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }
    pub fn corrupted(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Corrupted, message)
    }
    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::PermissionDenied, message)
    }
    pub fn closed(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Closed, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
}

/// What an error can be about; [`Error::subject`] reads its name from the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Subject {
    Partition,
    Key,
    Field,
    Unit,
}

impl Subject {
    /// How messages introduce the subject's name (followed by the name and a backtick).
    fn marker(self) -> &'static str {
        match self {
            Subject::Partition => "partition `",
            Subject::Key => "key `",
            Subject::Field => "field `",
            Subject::Unit => "unit `",
        }
    }
}

/// Returns `Err(Error::invalid(..))` from the enclosing function when `cond` is false.
#[macro_export]
macro_rules! ensure_valid {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err($crate::Error::invalid(format!($($arg)+)));
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_read_from_the_message_convention() {
        let e = Error::not_found("key `k1` not found").context("partition `train`");
        assert_eq!(e.subject(Subject::Partition), Some("train"));
        assert_eq!(e.subject(Subject::Key), Some("k1"));
        assert_eq!(e.subject(Subject::Field), None);
        // A word that merely ends in a marker ("monkey `x`") names no key.
        let e = Error::invalid("monkey `x`: field `f`");
        assert_eq!(e.subject(Subject::Key), None);
        assert_eq!(e.subject(Subject::Field), Some("f"));
        // An unterminated name is no name.
        assert_eq!(Error::invalid("unit `u0").subject(Subject::Unit), None);
        assert_eq!(
            Error::invalid("unit `u0`").subject(Subject::Unit),
            Some("u0")
        );
    }

    #[test]
    fn display_names_kind_and_message() {
        let e = Error::unsupported("update", "redis");
        assert_eq!(
            e.kind(),
            &ErrorKind::Unsupported {
                operation: "update".into(),
                backend: "redis".into()
            }
        );
        assert!(e.to_string().contains("redis"));
        assert!(!e.is_retryable());
        assert_eq!(e.retry(), Retry::Never);
        let timeout = Error::timeout("x");
        assert_eq!(timeout.retry(), Retry::OutcomeUnknown);
        assert!(!timeout.is_retryable(), "a timeout may have taken effect");
        assert!(Error::timeout("x").with_retry(Retry::Safe).is_retryable());
        assert!(Error::unavailable("x").is_retryable());
        let kept = Error::unavailable("x")
            .with_retry(Retry::OutcomeUnknown)
            .context("partition `p`");
        assert_eq!(
            kept.retry(),
            Retry::OutcomeUnknown,
            "context keeps the status"
        );
        let e = Error::not_found("key `a`").context("partition `p`");
        assert_eq!(e.message(), "partition `p`: key `a`");
    }
}
