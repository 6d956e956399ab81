//! How a [`super::Pool`] connects, waits and retries ([`ClientConfig`], [`RetryConfig`]), and
//! the choices of one call ([`CallOptions`]).

use crate::frame::Limits;
use std::time::Duration;

/// How a [`crate::Pool`] connects and waits.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// What a server may send back in one message (and what this client refuses to send).
    pub limits: Limits,
    /// Presented in every handshake; servers off loopback require it.
    pub token: Option<String>,
    /// Longest wait for a TCP/Unix connect plus handshake. Default 5 s.
    pub connect_timeout: Duration,
    /// Default deadline of one request attempt ([`CallOptions::timeout`] overrides). Default 30 s.
    pub request_timeout: Duration,
    /// Connections kept per peer. More than one lets large transfers to one peer proceed on
    /// several sockets; a new one is opened only while every existing one is busy. Default 2.
    pub connections_per_peer: usize,
    /// How requests are repeated after transport failures (see [`RetryConfig`]).
    pub retry: RetryConfig,
}

/// How a [`crate::Pool`] repeats a request after a transport failure (no connection, a lost one, no
/// answer in time) — the shape of object_store's `RetryConfig`: backoff with jitter under a
/// total deadline, on by default. Only what is safe is repeated: an idempotent request, or a
/// request that was not sent at all. The first retry goes out at once on a fresh connection;
/// each later one waits a backoff that doubles from `initial_backoff` up to `max_backoff`,
/// with jitter (half to all of it). Retries stop once `max_elapsed` has passed since the first
/// attempt, and never outlast the request's own deadline, so a dead peer still fails within
/// its timeout; an idempotent request is always retried at least once. Each retry is counted
/// in `tq_net_retries_total`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryConfig {
    /// Default 10 s: rides out a controller or unit restart.
    pub max_elapsed: Duration,
    /// Default 20 ms.
    pub initial_backoff: Duration,
    /// Default 1 s.
    pub max_backoff: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_elapsed: Duration::from_secs(10),
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_secs(1),
        }
    }
}

impl RetryConfig {
    /// No retry beyond the one an idempotent request always gets.
    pub fn once() -> Self {
        RetryConfig {
            max_elapsed: Duration::ZERO,
            ..RetryConfig::default()
        }
    }

    /// `backoff` with jitter: a uniformly drawn point between half of it and all of it.
    pub(super) fn jittered(backoff: Duration) -> Duration {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(backoff.as_nanos() as u64);
        let unit = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
        backoff.mul_f64(0.5 + 0.5 * unit)
    }
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            limits: Limits::default(),
            token: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            connections_per_peer: 2,
            retry: RetryConfig::default(),
        }
    }
}

/// Per-call choices.
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// Deadline of one attempt; `None` uses [`ClientConfig::request_timeout`].
    pub timeout: Option<Duration>,
    /// True when applying the request twice has the same effect as once (get, put of the same
    /// generation, clear). Only such requests are retried after a lost connection or a passed
    /// deadline; for the others the outcome is then unknown and the caller is told so.
    pub idempotent: bool,
}

impl CallOptions {
    /// Options for an idempotent request (retried on fresh connections, see [`RetryConfig`]).
    pub fn idempotent() -> Self {
        CallOptions {
            timeout: None,
            idempotent: true,
        }
    }

    /// Options for a request that must not be repeated (never retried).
    pub fn once() -> Self {
        CallOptions::default()
    }

    /// Sets the per-attempt deadline.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}
