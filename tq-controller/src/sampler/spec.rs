//! [`SamplerSpec`]: the built-in samplers by name, as configuration writes them.

use super::{
    GrpoGroupNSampler, RankAwareSampler, Sampler, SeqlenBalancedSampler, SequentialSampler,
};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use tq_core::{Error, Result};

const ACCEPTED: &str = "expected `sequential`, `grpo:<n>`, `rank-aware`, \
                        `seqlen-balanced:<dp_size>` or `seqlen-balanced:<dp_size>:<n>`";

/// A built-in sampler and its parameters. Parsed from (and displayed as) the strings
/// configuration uses:
/// - `sequential` — [`SequentialSampler`];
/// - `grpo:<n>` — [`GrpoGroupNSampler`] with groups of `n`;
/// - `rank-aware` — [`RankAwareSampler`];
/// - `seqlen-balanced:<dp_size>` or `seqlen-balanced:<dp_size>:<n>` — [`SeqlenBalancedSampler`]
///   over `dp_size` ranks with groups of `n` (default 1); needs `dp_rank` and `batch_index` in
///   every fetch.
///
/// Anything else, or a malformed or zero number, is `Invalid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SamplerSpec {
    #[default]
    Sequential,
    Grpo {
        group_size: usize,
    },
    RankAware,
    SeqlenBalanced {
        dp_size: usize,
        group_size: usize,
    },
}

impl SamplerSpec {
    /// A fresh sampler of this kind (samplers with state, like rank-aware, start empty).
    /// `Invalid` for a zero size in a spec built by hand.
    pub fn build(&self) -> Result<Arc<dyn Sampler>> {
        Ok(match *self {
            SamplerSpec::Sequential => Arc::new(SequentialSampler),
            SamplerSpec::Grpo { group_size } => Arc::new(GrpoGroupNSampler::new(group_size)?),
            SamplerSpec::RankAware => Arc::new(RankAwareSampler::new()),
            SamplerSpec::SeqlenBalanced {
                dp_size,
                group_size,
            } => Arc::new(SeqlenBalancedSampler::new(group_size, dp_size)?),
        })
    }
}

impl FromStr for SamplerSpec {
    type Err = Error;

    fn from_str(name: &str) -> Result<SamplerSpec> {
        let number = |what: &str, v: &str| -> Result<usize> {
            match v.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(Error::invalid(format!(
                    "sampler `{name}`: `{v}` is not a {what} of at least 1 ({ACCEPTED})"
                ))),
            }
        };
        match name.split_once(':') {
            None if name == "sequential" => Ok(SamplerSpec::Sequential),
            None if name == "rank-aware" => Ok(SamplerSpec::RankAware),
            Some(("grpo", n)) => Ok(SamplerSpec::Grpo {
                group_size: number("group size", n)?,
            }),
            Some(("seqlen-balanced", rest)) => {
                let (dp_size, n) = rest.split_once(':').unwrap_or((rest, "1"));
                Ok(SamplerSpec::SeqlenBalanced {
                    dp_size: number("dp size", dp_size)?,
                    group_size: number("group size", n)?,
                })
            }
            _ => Err(Error::invalid(format!(
                "unknown sampler `{name}` ({ACCEPTED})"
            ))),
        }
    }
}

impl fmt::Display for SamplerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SamplerSpec::Sequential => f.write_str("sequential"),
            SamplerSpec::Grpo { group_size } => write!(f, "grpo:{group_size}"),
            SamplerSpec::RankAware => f.write_str("rank-aware"),
            SamplerSpec::SeqlenBalanced {
                dp_size,
                group_size,
            } => write!(f, "seqlen-balanced:{dp_size}:{group_size}"),
        }
    }
}

impl Serialize for SamplerSpec {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SamplerSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<SamplerSpec, D::Error> {
        let s = String::deserialize(d)?;
        s.parse()
            .map_err(|e: Error| serde::de::Error::custom(e.message()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_round_trip_through_their_strings() {
        for s in ["sequential", "grpo:4", "rank-aware", "seqlen-balanced:2:3"] {
            let spec: SamplerSpec = s.parse().unwrap();
            assert_eq!(spec.to_string(), s);
        }
        assert_eq!(
            "seqlen-balanced:8".parse::<SamplerSpec>().unwrap(),
            SamplerSpec::SeqlenBalanced {
                dp_size: 8,
                group_size: 1
            }
        );
        for bad in ["", "grpo", "grpo:0", "grpo:x", "seqlen-balanced:0", "fifo"] {
            let e = bad.parse::<SamplerSpec>().unwrap_err();
            assert_eq!(e.kind(), &tq_core::ErrorKind::Invalid, "{bad}");
        }
    }
}
