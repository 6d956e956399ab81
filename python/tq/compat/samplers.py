"""The original's sampler classes, each standing for one of tq's samplers (which run in the
controller, in Rust)."""

from __future__ import annotations

from ..errors import UnsupportedError

__all__ = ["BaseSampler", "SequentialSampler", "GRPOGroupNSampler", "RankAwareSampler", "SeqlenBalancedSampler"]


class BaseSampler:
    """Base class of the samplers; :meth:`spec` is the tq sampler the controller runs."""

    def spec(self) -> str:
        """tq's specification of this sampler (``"grpo:4"``, ...)."""
        raise UnsupportedError(
            f"sampler `{type(self).__name__}`: samplers written in Python are not supported by "
            "tq.compat yet; use one of SequentialSampler, GRPOGroupNSampler, RankAwareSampler, "
            "SeqlenBalancedSampler"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class SequentialSampler(BaseSampler):
    """The oldest ready samples first (the default)."""

    def spec(self) -> str:
        return "sequential"


class GRPOGroupNSampler(BaseSampler):
    """Whole groups of ``n_samples_per_prompt`` consecutive samples, all ready together."""

    def __init__(self, n_samples_per_prompt: int = 1) -> None:
        self.n_samples_per_prompt = int(n_samples_per_prompt)

    def spec(self) -> str:
        return f"grpo:{self.n_samples_per_prompt}"


class RankAwareSampler(BaseSampler):
    """Every data-parallel rank of a group gets the same batch for the same step."""

    def spec(self) -> str:
        return "rank-aware"


class SeqlenBalancedSampler(BaseSampler):
    """Groups spread over ``dp_size`` ranks with balanced total sequence length."""

    def __init__(self, n_samples_per_prompt: int = 1, dp_size: int = 1) -> None:
        self.n_samples_per_prompt = int(n_samples_per_prompt)
        self.dp_size = int(dp_size)

    def spec(self) -> str:
        return f"seqlen-balanced:{self.dp_size}:{self.n_samples_per_prompt}"
