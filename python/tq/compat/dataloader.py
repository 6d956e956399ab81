"""TransferQueue's ``StreamingDataset`` and ``StreamingDataLoader`` on tq.

The dataset yields ``(TensorDict, BatchMeta)`` micro-batches of a partition for one task and
data-parallel rank. It holds only the configuration ``init()`` returned (which says where the
deployment is), so it pickles to spawned DataLoader workers and survives forks: each process
that iterates opens its own connection (no Ray call, no runtime shared across a fork).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from torch.utils.data import DataLoader, IterableDataset

from tq.errors import ClosedError, TimeoutError

from . import _deploy
from ._client import TransferQueueClient
from ._meta import BatchMeta
from ._rows import slice_rows

__all__ = ["StreamingDataset", "StreamingDataLoader", "default_fetch_batch_fn", "chunk_batch_fn"]

#: How long one fetch of the default fetch function waits at the controller for a batch
#: before the dataset checks whether it should stop (seconds).
FETCH_WAIT_SECONDS = 1.0


def default_fetch_batch_fn(
    tq_client: TransferQueueClient,
    data_fields: Sequence[str],
    batch_size: int,
    partition_id: str,
    task_name: str,
    sampling_config: Mapping[str, Any],
    batch_index: int,
) -> Tuple[Any, BatchMeta]:
    """Fetches one batch: ``(data, meta)``, or ``(None, meta)`` when none is ready yet. The
    wait happens at the controller (up to ``FETCH_WAIT_SECONDS``), not in a sleep."""
    config = {**dict(sampling_config), "batch_index": batch_index, "partition_id": partition_id}
    try:
        native = tq_client._native.get_meta(
            partition_id, list(data_fields), "fetch", int(batch_size), task_name, FETCH_WAIT_SECONDS, tq_client.sampler,
            config.get("dp_rank"), batch_index, tq_client.lease,
        )
    except TimeoutError:
        return None, BatchMeta.empty()
    meta = BatchMeta.from_native(native, task=task_name)
    if meta.size == 0:
        return None, meta
    return tq_client.get_data(meta), meta


def chunk_batch_fn(data: Any, meta: BatchMeta, micro_batch_size: int) -> Iterator[Tuple[Any, BatchMeta]]:
    """Consecutive micro-batches of ``micro_batch_size`` rows (the last may be shorter); the
    metadata is split at the same rows as the data."""
    if not hasattr(data, "batch_size"):
        raise TypeError(f"chunk_batch_fn: expected a TensorDict, got {type(data).__name__}")
    if not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"chunk_batch_fn: micro_batch_size must be a positive int, got {micro_batch_size!r}")
    if len(data.batch_size) == 0:
        raise ValueError("chunk_batch_fn: the data has no batch dimension")
    rows = int(data.batch_size[0])
    for start in range(0, rows, micro_batch_size):
        stop = min(start + micro_batch_size, rows)
        if start == 0 and stop == rows:
            yield data, meta
        else:
            yield slice_rows(data, start, stop), meta.select_samples(list(range(start, stop)))


class StreamingDataset(IterableDataset):  # type: ignore[misc]
    """Micro-batches of ``partition_id`` for ``task_name`` as ``(TensorDict, BatchMeta)``.

    Every rank with the same ``dp_rank`` gets the same samples (with the rank-aware
    samplers). With ``should_check_consumption_status=False`` the stream never ends (online
    training); with ``True`` it ends once the task consumed every sample of the partition
    and the buffered batches were replayed. A partition marked complete ends it too.
    Batches are kept: :meth:`reset` replays them, :meth:`step` moves to another partition.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        batch_size: int,
        micro_batch_size: int,
        data_fields: Sequence[str],
        partition_id: str,
        task_name: str,
        dp_rank: int,
        should_check_consumption_status: bool = False,
        fetch_batch_fn: Optional[Callable[..., Tuple[Any, BatchMeta]]] = None,
        process_batch_fn: Optional[Callable[..., Iterator[Tuple[Any, BatchMeta]]]] = None,
    ) -> None:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        if len(data_fields) < 1:
            raise ValueError(f"data_fields must name at least one field, got {data_fields}")
        if dp_rank < 0:
            raise ValueError(f"dp_rank must be >= 0, got {dp_rank}")
        super().__init__()
        self.config = _address_of(config)
        self.batch_size = batch_size
        self.micro_batch_size = micro_batch_size
        self.data_fields = list(data_fields)
        self.partition_id = partition_id
        self.task_name = task_name
        self.dp_rank = dp_rank
        self.should_check_consumption_status = should_check_consumption_status
        self.fetch_batch_fn = fetch_batch_fn or default_fetch_batch_fn
        self.process_batch_fn = process_batch_fn or chunk_batch_fn
        self.sampling_config = {"dp_rank": dp_rank, "task_name": task_name}
        self.buffer: List[Tuple[Any, BatchMeta]] = []
        self.batch_index = 0
        self._client: Optional[TransferQueueClient] = None
        self._client_pid: Optional[int] = None

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = state["_client_pid"] = None  # each process connects on its own
        return state

    def _tq_client(self) -> TransferQueueClient:
        if self._client is None or self._client_pid != os.getpid():
            self._client = _deploy.compat_client(self.config, _deploy.connect(self.config))
            self._client_pid = os.getpid()
        return self._client

    def _finished(self, client: TransferQueueClient) -> bool:
        if self.batch_index < len(self.buffer):
            return False
        return self.should_check_consumption_status and client.check_consumption_status(self.task_name, self.partition_id)

    def __iter__(self) -> Iterator[Tuple[Any, BatchMeta]]:
        client = self._tq_client()
        while not self._finished(client):
            if self.batch_index < len(self.buffer):
                data, meta = self.buffer[self.batch_index]
                self.batch_index += 1
                yield from self.process_batch_fn(data, meta, micro_batch_size=self.micro_batch_size)
                continue
            try:
                data, meta = self.fetch_batch_fn(
                    tq_client=client,
                    data_fields=self.data_fields,
                    batch_size=self.batch_size,
                    partition_id=self.partition_id,
                    task_name=self.task_name,
                    sampling_config=self.sampling_config,
                    batch_index=self.batch_index,
                )
            except ClosedError:  # the partition is complete and this task took all of it
                return
            if data is not None:
                self.buffer.append((data, meta))
            elif self.fetch_batch_fn is not default_fetch_batch_fn:
                # A custom fetch function that found nothing: back off as the original does
                # (the default one waits at the controller instead).
                time.sleep(1.0)

    def reset(self) -> None:
        """Starts again from the first buffered batch."""
        self.batch_index = 0

    def step(self, partition_id: str) -> None:
        """Moves to ``partition_id``: drops the buffer and starts from its beginning."""
        self.buffer = []
        self.batch_index = 0
        self.partition_id = partition_id

    def get_buffer(self) -> List[Tuple[Any, BatchMeta]]:
        """The batches fetched so far, ``(data, meta)`` each."""
        return self.buffer


def _address_of(config: Mapping[str, Any]) -> Dict[str, Any]:
    """What a worker needs to attach (``_deploy.attachment``), from what ``init()`` returned
    or, when ``config`` does not say where the deployment is, from this process's own."""
    from . import _attached, _config

    plain = _config.plain(config)
    if not ((plain.get("backend") or {}).get("tq") or {}).get("connect"):
        plain = _attached().conf
    return _deploy.attachment(plain)


def _identity(item: Any) -> Any:
    return item


class StreamingDataLoader(DataLoader):  # type: ignore[misc]
    """A ``torch.utils.data.DataLoader`` over a :class:`StreamingDataset`: no batching, no
    shuffling, items as the dataset yields them."""

    def __init__(
        self,
        dataset: StreamingDataset,
        num_workers: int = 0,
        collate_fn: Optional[Callable[[Any], Any]] = None,
        pin_memory: bool = False,
        worker_init_fn: Optional[Callable[[int], None]] = None,
        multiprocessing_context: Any = None,
        prefetch_factor: Optional[int] = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
    ) -> None:
        self.dataset_ref = dataset
        super().__init__(
            dataset,
            batch_size=None,
            shuffle=None,
            sampler=None,
            batch_sampler=None,
            num_workers=num_workers,
            collate_fn=collate_fn or _identity,
            pin_memory=pin_memory,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
        )

    def reset(self) -> None:
        self.dataset_ref.reset()

    def step(self, partition_id: str) -> None:
        self.dataset_ref.step(partition_id)

    def get_buffer(self) -> List[Tuple[Any, BatchMeta]]:
        return self.dataset_ref.get_buffer()
