"""``transfer_queue.sampler``'s names: ``from tq.compat.sampler import BaseSampler``."""

from .samplers import BaseSampler, GRPOGroupNSampler, RankAwareSampler, SeqlenBalancedSampler, SequentialSampler

__all__ = ["BaseSampler", "SequentialSampler", "GRPOGroupNSampler", "RankAwareSampler", "SeqlenBalancedSampler"]
