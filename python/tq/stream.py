"""Streams: a partition's batches as they become ready, as an iterator or an async iterator,
and a dataset that works in DataLoader worker processes.

A stream fetches for one task until the partition is complete and the task has consumed all
of it. Every batch goes to one consumer: several streams (threads, processes, DataLoader
workers) of the same task share the partition's samples, each sample handed out once.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Dict, Iterator, Mapping, Optional, Sequence, Tuple

from .errors import ClosedError, TimeoutError

if TYPE_CHECKING:  # pragma: no cover
    from . import BatchMeta, Partition

Item = Tuple["BatchMeta", Dict[str, Any]]


def _give_up(started: float, idle_timeout: Optional[float]) -> bool:
    return idle_timeout is not None and time.monotonic() - started >= idle_timeout


def _wait(started: float, idle_timeout: Optional[float]) -> Optional[float]:
    """How long the next fetch may wait: what is left of `idle_timeout` (the configured fetch
    timeout when there is none)."""
    if idle_timeout is None:
        return None
    return max(idle_timeout - (time.monotonic() - started), 0.01)


def stream(
    partition: "Partition",
    fields: Sequence[str],
    task: str,
    batch_size: int,
    *,
    sampler: Optional[str] = None,
    lease: Optional[float] = None,
    idle_timeout: Optional[float] = None,
) -> Iterator[Item]:
    """See :meth:`tq.Partition.stream`."""
    client = partition._client
    names = list(fields)
    previous = None
    waiting_since = time.monotonic()
    while True:
        # Asked for the next batch: the consumer is done with the previous one.
        if previous is not None:
            client.ack(task, previous)
            previous = None
        try:
            wait = _wait(waiting_since, idle_timeout)
            meta = partition.fetch(names, task, batch_size, timeout=wait, sampler=sampler, lease=lease)
        except ClosedError:
            break
        except TimeoutError:
            if _give_up(waiting_since, idle_timeout):
                raise
            continue
        waiting_since = time.monotonic()
        yield meta, client.get_data(meta)
        if lease is not None:
            previous = meta  # acknowledged when the next batch is asked for


async def async_stream(
    partition: "Partition",
    fields: Sequence[str],
    task: str,
    batch_size: int,
    *,
    sampler: Optional[str] = None,
    lease: Optional[float] = None,
    idle_timeout: Optional[float] = None,
) -> AsyncIterator[Item]:
    """See :meth:`tq.Partition.async_stream`."""
    client = partition._client
    names = list(fields)
    previous = None
    waiting_since = time.monotonic()
    while True:
        # Asked for the next batch: the consumer is done with the previous one.
        if previous is not None:
            await client.async_ack(task, previous)
            previous = None
        try:
            wait = _wait(waiting_since, idle_timeout)
            meta = await partition.async_fetch(names, task, batch_size, timeout=wait, sampler=sampler, lease=lease)
        except ClosedError:
            break
        except TimeoutError:
            if _give_up(waiting_since, idle_timeout):
                raise
            continue
        waiting_since = time.monotonic()
        yield meta, await client.async_get_data(meta)
        if lease is not None:
            previous = meta


class StreamingDataset:
    """An iterable over a partition's batches for one task, for ``torch.utils.data.DataLoader``
    (use ``batch_size=None``: each item is already a batch) or any worker pool.

    It holds only the deployment's address and the stream's settings, so it pickles to spawned
    workers and survives forks: every iteration opens a client of its own in the process that
    iterates (a runtime is never shared across a fork). Items are dicts of field → value, as
    :meth:`tq.Client.get_data` returns them; with ``with_meta=True``, ``(BatchMeta, data)``.
    """

    def __init__(
        self,
        url: str,
        partition: str,
        fields: Sequence[str],
        task: str,
        batch_size: int,
        *,
        token: Optional[str] = None,
        config: Optional[Mapping[str, Any]] = None,
        sampler: Optional[str] = None,
        lease: Optional[float] = None,
        idle_timeout: Optional[float] = None,
        with_meta: bool = False,
    ) -> None:
        self.url = url
        self.partition = partition
        self.fields = list(fields)
        self.task = task
        self.batch_size = batch_size
        self.token = token
        self.config = dict(config) if config else None
        self.sampler = sampler
        self.lease = lease
        self.idle_timeout = idle_timeout
        self.with_meta = with_meta

    def __iter__(self) -> Iterator[Any]:
        from . import connect

        with connect(self.url, token=self.token, config=self.config) as client:
            items = stream(
                client.partition(self.partition),
                self.fields,
                self.task,
                self.batch_size,
                sampler=self.sampler,
                lease=self.lease,
                idle_timeout=self.idle_timeout,
            )
            for meta, data in items:
                yield (meta, data) if self.with_meta else data

    def __repr__(self) -> str:
        return f"StreamingDataset({self.url!r}, partition={self.partition!r}, task={self.task!r}, batch_size={self.batch_size})"


_TORCH_DATASET: Any = None


def torch_dataset_class() -> Any:
    """:class:`StreamingDataset` as a ``torch.utils.data.IterableDataset`` (what
    ``tq.StreamingDataset`` is when torch is installed), made on first use so that importing
    tq never imports torch."""
    global _TORCH_DATASET
    if _TORCH_DATASET is None:
        from torch.utils.data import IterableDataset

        class TorchStreamingDataset(StreamingDataset, IterableDataset):  # type: ignore[misc]
            __doc__ = StreamingDataset.__doc__

        TorchStreamingDataset.__module__ = __name__
        TorchStreamingDataset.__qualname__ = "TorchStreamingDataset"
        _TORCH_DATASET = TorchStreamingDataset
    return _TORCH_DATASET


def __getattr__(name: str) -> Any:
    # Pickles of a torch-backed dataset name `tq.stream.TorchStreamingDataset`.
    if name == "TorchStreamingDataset":
        return torch_dataset_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
