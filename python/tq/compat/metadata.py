"""``transfer_queue.metadata``'s names: ``from tq.compat.metadata import BatchMeta``."""

from ._meta import BatchMeta, KVBatchMeta

__all__ = ["BatchMeta", "KVBatchMeta"]
