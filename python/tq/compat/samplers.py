"""The original's sampler classes: the built-in ones stand for tq's samplers (which run in
the controller, in Rust); a subclass of :class:`BaseSampler` of your own is called back by
the controller."""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Mapping, Optional, Tuple

__all__ = ["BaseSampler", "SequentialSampler", "GRPOGroupNSampler", "RankAwareSampler", "SeqlenBalancedSampler"]


class BaseSampler:
    """Base class of the samplers (TransferQueue's ``BaseSampler``).

    The four built-in subclasses stand for tq's samplers, which run in the controller in Rust
    (:meth:`spec` names them). A subclass of your own implements :meth:`sample`; tq's
    controller then calls it from Rust, in the process that hosts the controller (the calling
    process, or the controller's Ray actor), with the GIL and inside the controller's critical
    section, so keep it quick. It receives the ready global indexes (produced for every
    requested field, not consumed by the task), the batch size, and the context as keywords:
    ``partition_id``, ``task_name``, and ``dp_rank`` / ``batch_index`` when the fetch gave them.
    It answers ``(sampled, consumed)``, both lists of indexes from ``ready`` (an empty
    ``sampled`` means "not enough yet"). ``_states`` is the original's cache: what
    :meth:`has_cached_result` and :meth:`clear_cache` look at and what checkpoints keep.
    """

    def __init__(self) -> None:
        self._states: Dict[Any, Any] = {}

    def spec(self) -> Optional[str]:
        """tq's built-in sampler this one is (``"grpo:4"``, ...); ``None`` for a sampler
        written in Python, which the controller calls back."""
        return None

    def sample(self, ready_indexes: List[int], batch_size: int, *args: Any, **kwargs: Any) -> Tuple[List[int], List[int]]:
        """``(sampled, consumed)`` out of ``ready_indexes``; see the class docstring."""
        raise NotImplementedError(f"{type(self).__name__} must implement sample()")

    def __call__(self, *args: Any, **kwargs: Any) -> Tuple[List[int], List[int]]:
        return self.sample(*args, **kwargs)

    def has_cached_result(self, partition_id: str, task_name: str, sampling_config: Optional[Mapping[str, Any]] = None) -> bool:
        """Whether ``_states[partition_id][task_name][dp_rank]`` holds an answer for the
        config's ``batch_index`` (then a polling fetch goes ahead with fewer ready samples)."""
        config = dict(sampling_config or {})
        dp_rank = config.get("dp_rank")
        if dp_rank is None:
            return False
        by_rank = self._states.get(partition_id, {}).get(task_name, {})
        return dp_rank in by_rank and config.get("batch_index") in by_rank[dp_rank]

    def clear_cache(self, partition_id: str) -> None:
        """Forgets what was cached for ``partition_id`` (called when it is cleared)."""
        self._states.pop(partition_id, None)

    def save_checkpoint(self) -> Dict[str, Any]:
        """The state a checkpoint keeps (pickled with the controller's state)."""
        return {"_states": copy.deepcopy(self._states)}

    def load_checkpoint(self, state: Mapping[str, Any]) -> None:
        """Restores what :meth:`save_checkpoint` gave."""
        self._states = copy.deepcopy(dict(state).get("_states", {}))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class SequentialSampler(BaseSampler):
    """The oldest ready samples first (the default)."""

    def spec(self) -> str:
        return "sequential"


class GRPOGroupNSampler(BaseSampler):
    """Whole groups of ``n_samples_per_prompt`` consecutive samples, all ready together."""

    def __init__(self, n_samples_per_prompt: int = 1) -> None:
        super().__init__()
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
        super().__init__()
        self.n_samples_per_prompt = int(n_samples_per_prompt)
        self.dp_size = int(dp_size)

    def spec(self) -> str:
        return f"seqlen-balanced:{self.dp_size}:{self.n_samples_per_prompt}"
