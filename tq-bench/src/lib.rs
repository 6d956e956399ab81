//! tq-bench: the standard workloads of `docs/benchmarks.md`, a small measurement harness (median,
//! min, max over repetitions after a warm-up) and the runs `tq bench` reports.
//!
//! Criterion benches under `benches/` use the same workloads for regression tracking.

pub mod baseline;
pub mod clears;
pub mod controller;
pub mod kv;
pub mod kv_raw;
pub mod latency;
pub mod links;
pub mod measure;
pub mod same_host;
pub mod scale;
pub mod servers;
pub mod ssd;
pub mod steps;
pub mod workloads;

pub use measure::{measure, Stats};
