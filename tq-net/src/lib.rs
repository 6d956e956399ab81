//! tq-net: the wire protocol and transport of tq.
//!
//! Every remote component (controller server, storage-unit servers, remote clients) talks through
//! this crate. It moves *messages* between processes over TCP or Unix domain sockets:
//!
//! - A [`Message`] is a small opaque header (callers put a postcard-encoded struct there) plus any
//!   number of raw payload frames. Payload bytes never pass through an encoder: they leave with
//!   vectored writes straight from their `Bytes` and arrive as `Bytes` slices of one receive
//!   buffer. Moving tensors is the workload, so copying them is the cost to avoid.
//! - A connection starts with a handshake (magic `TQNET`, protocol version, access token), so a
//!   mismatched or unauthorized peer fails at once with a message that says why.
//! - Every request carries an id; many requests are in flight on one connection and answers come
//!   back in any order. A [`Pool`] keeps a few connections per peer and reuses them.
//! - Everything a peer claims is checked against [`Limits`] before anything is allocated for it;
//!   a malformed, truncated or oversized message closes that one connection and nothing else.
//! - Failures are `tq_core::Error`s: a remote handler's error arrives with its kind and message
//!   intact ([`WireError`]); transport failures are `Unavailable` or `Timeout` and name the peer.
//!   Only requests the caller marks idempotent are retried.
//!
//! The exact byte layout is in `docs/protocol.md` (and summarized in [`frame`] and
//! [`handshake`]). Typed RPCs (controller, storage units) are built on [`Pool::call`] and
//! [`Handler`] by the crates that own those operations.

mod awake;
mod client;
mod endpoint;
mod error;
pub mod frame;
pub mod handshake;
mod server;
mod stream;

pub use client::{CallOptions, ClientConfig, PlacedAnswer, Pool, RetryConfig};
pub use endpoint::Endpoint;
pub use error::WireError;
pub use frame::{Limits, Message, MessageKind};
pub use handshake::PROTOCOL_VERSION;
pub use server::{ConnectionCount, Handler, Server, ServerConfig, DEFAULT_STAY_AWAKE};

/// Re-exported so handler implementations use the same macro version as the trait.
pub use async_trait::async_trait;
