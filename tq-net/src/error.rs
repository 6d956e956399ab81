//! [`WireError`]: how a `tq_core::Error` crosses the wire in an error response (kind 2).
//!
//! A remote failure must reach the caller as the same [`ErrorKind`] it had on the server, so that
//! callers can match on it exactly as they would in an embedded deployment (one code path,
//! docs/architecture.md, "Remote deployment"). The kind travels as a stable numeric code rather
//! than as serde's enum encoding, so that adding an `ErrorKind` variant later does not shift the
//! codes of the others.
//! The error's `source` chain does not travel: it is process-local (an `io::Error`, ...), and the
//! message is what the caller needs.

use serde::{Deserialize, Serialize};
use tq_core::{Error, ErrorKind, Retry};

/// The header of an error response: a `tq_core::Error` in transportable form.
///
/// `code` is one of the `WireError::*` constants below; `operation` and `backend` are set only for
/// [`ErrorKind::Unsupported`]. An unknown code (sent by a newer peer) decodes as
/// [`ErrorKind::Internal`] with the code named in the message, so nothing is silently lost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireError {
    /// The error kind, as a stable number (see the associated constants).
    pub code: u8,
    /// The error message, exactly as the server produced it.
    pub message: String,
    /// `Unsupported { operation, .. }`.
    pub operation: Option<String>,
    /// `Unsupported { backend, .. }`.
    pub backend: Option<String>,
    /// The error's [`Retry`] status, as set where it was made (see the `RETRY_*` constants).
    pub retry: u8,
}

impl WireError {
    /// [`ErrorKind::Invalid`].
    pub const INVALID: u8 = 1;
    /// [`ErrorKind::NotFound`].
    pub const NOT_FOUND: u8 = 2;
    /// [`ErrorKind::Conflict`].
    pub const CONFLICT: u8 = 3;
    /// [`ErrorKind::CapacityExceeded`].
    pub const CAPACITY_EXCEEDED: u8 = 4;
    /// [`ErrorKind::DataLost`].
    pub const DATA_LOST: u8 = 5;
    /// [`ErrorKind::Unsupported`] (with `operation` and `backend`).
    pub const UNSUPPORTED: u8 = 6;
    /// [`ErrorKind::Timeout`].
    pub const TIMEOUT: u8 = 7;
    /// [`ErrorKind::Unavailable`].
    pub const UNAVAILABLE: u8 = 8;
    /// [`ErrorKind::Corrupted`].
    pub const CORRUPTED: u8 = 9;
    /// [`ErrorKind::Closed`].
    pub const CLOSED: u8 = 10;
    /// [`ErrorKind::Internal`], and any kind this build does not know.
    pub const INTERNAL: u8 = 11;
    /// [`ErrorKind::PermissionDenied`].
    pub const PERMISSION_DENIED: u8 = 12;

    /// [`Retry::Safe`].
    pub const RETRY_SAFE: u8 = 0;
    /// [`Retry::OutcomeUnknown`], and any status this build does not know.
    pub const RETRY_OUTCOME_UNKNOWN: u8 = 1;
    /// [`Retry::Never`].
    pub const RETRY_NEVER: u8 = 2;

    fn retry_code(retry: Retry) -> u8 {
        match retry {
            Retry::Safe => Self::RETRY_SAFE,
            Retry::Never => Self::RETRY_NEVER,
            _ => Self::RETRY_OUTCOME_UNKNOWN,
        }
    }

    fn retry_of(code: u8) -> Retry {
        match code {
            Self::RETRY_SAFE => Retry::Safe,
            Self::RETRY_NEVER => Retry::Never,
            // Unknown codes are treated as the cautious answer.
            _ => Retry::OutcomeUnknown,
        }
    }

    /// The transportable form of `error` (kind and message; the source chain stays behind).
    pub fn from_error(error: &Error) -> WireError {
        let (code, operation, backend) = match error.kind() {
            ErrorKind::Invalid => (Self::INVALID, None, None),
            ErrorKind::NotFound => (Self::NOT_FOUND, None, None),
            ErrorKind::Conflict => (Self::CONFLICT, None, None),
            ErrorKind::CapacityExceeded => (Self::CAPACITY_EXCEEDED, None, None),
            ErrorKind::DataLost => (Self::DATA_LOST, None, None),
            ErrorKind::Unsupported { operation, backend } => (
                Self::UNSUPPORTED,
                Some(operation.clone()),
                Some(backend.clone()),
            ),
            ErrorKind::Timeout => (Self::TIMEOUT, None, None),
            ErrorKind::Unavailable => (Self::UNAVAILABLE, None, None),
            ErrorKind::Corrupted => (Self::CORRUPTED, None, None),
            ErrorKind::Closed => (Self::CLOSED, None, None),
            ErrorKind::Internal => (Self::INTERNAL, None, None),
            ErrorKind::PermissionDenied => (Self::PERMISSION_DENIED, None, None),
            // `ErrorKind` is non-exhaustive: a kind added after this build travels as Internal,
            // with its display name kept in the message so the information is not lost.
            other => {
                return WireError {
                    code: Self::INTERNAL,
                    message: format!("{other}: {}", error.message()),
                    operation: None,
                    backend: None,
                    retry: Self::retry_code(error.retry()),
                }
            }
        };
        WireError {
            code,
            message: error.message().to_owned(),
            operation,
            backend,
            retry: Self::retry_code(error.retry()),
        }
    }

    /// The `tq_core::Error` this wire error stands for, with the same kind and message.
    pub fn into_error(self) -> Error {
        let kind = match self.code {
            Self::INVALID => ErrorKind::Invalid,
            Self::NOT_FOUND => ErrorKind::NotFound,
            Self::CONFLICT => ErrorKind::Conflict,
            Self::CAPACITY_EXCEEDED => ErrorKind::CapacityExceeded,
            Self::DATA_LOST => ErrorKind::DataLost,
            Self::UNSUPPORTED => ErrorKind::Unsupported {
                operation: self.operation.unwrap_or_default(),
                backend: self.backend.unwrap_or_default(),
            },
            Self::TIMEOUT => ErrorKind::Timeout,
            Self::UNAVAILABLE => ErrorKind::Unavailable,
            Self::CORRUPTED => ErrorKind::Corrupted,
            Self::CLOSED => ErrorKind::Closed,
            Self::INTERNAL => ErrorKind::Internal,
            Self::PERMISSION_DENIED => ErrorKind::PermissionDenied,
            unknown => {
                return Error::internal(format!(
                    "peer sent an error of unknown kind code {unknown}: {}",
                    self.message
                ))
                .with_retry(Self::retry_of(self.retry))
            }
        };
        Error::new(kind, self.message).with_retry(Self::retry_of(self.retry))
    }
}

impl From<&Error> for WireError {
    fn from(error: &Error) -> Self {
        WireError::from_error(error)
    }
}

impl From<Error> for WireError {
    fn from(error: Error) -> Self {
        WireError::from_error(&error)
    }
}

impl From<WireError> for Error {
    fn from(wire: WireError) -> Self {
        wire.into_error()
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "error code {}: {}", self.code, self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_kinds() -> Vec<Error> {
        vec![
            Error::invalid("bad field `x`"),
            Error::not_found("key `k` in partition `p`"),
            Error::conflict("sample 3 is being cleared"),
            Error::capacity_exceeded("unit 2 is full"),
            Error::data_lost("cell (3, `f`) missing"),
            Error::unsupported("update", "redis"),
            Error::timeout("no answer"),
            Error::unavailable("unit 1 down"),
            Error::corrupted("bad bytes"),
            Error::closed("client closed"),
            Error::internal("invariant broken"),
            Error::permission_denied("token rejected"),
        ]
    }

    #[test]
    fn every_kind_round_trips_through_postcard() {
        let mut codes = std::collections::BTreeSet::new();
        for error in all_kinds() {
            let wire = WireError::from_error(&error);
            assert!(codes.insert(wire.code), "duplicate code {}", wire.code);
            let bytes = postcard::to_allocvec(&wire).expect("encode");
            let back: WireError = postcard::from_bytes(&bytes).expect("decode");
            assert_eq!(back, wire);
            let restored = back.into_error();
            assert_eq!(restored.kind(), error.kind());
            assert_eq!(restored.message(), error.message());
            assert_eq!(restored.retry(), error.retry());
        }
    }

    #[test]
    fn the_retry_status_set_where_an_error_was_made_crosses_the_wire() {
        for retry in [Retry::Safe, Retry::OutcomeUnknown, Retry::Never] {
            let e = Error::timeout("update of 3 samples").with_retry(retry);
            assert_eq!(WireError::from_error(&e).into_error().retry(), retry);
        }
    }

    #[test]
    fn unknown_code_becomes_internal_naming_the_code() {
        let e = WireError {
            code: 200,
            message: "from the future".into(),
            operation: None,
            backend: None,
            retry: 77,
        }
        .into_error();
        assert_eq!(
            e.retry(),
            Retry::OutcomeUnknown,
            "unknown status: the cautious answer"
        );
        assert_eq!(e.kind(), &ErrorKind::Internal);
        assert!(e.message().contains("200"));
        assert!(e.message().contains("from the future"));
    }
}
