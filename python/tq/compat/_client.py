"""TransferQueue's client (``TransferQueueClient``, what ``get_client()`` answers) on tq.

Every method has its ``async_`` twin (``get_meta`` / ``async_get_meta``), written once (see
``_calls``). Data comes back as a TensorDict; metadata is :class:`BatchMeta`.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import tq as _tq
from tq import _convert, _sampler_args
from tq import _torch as _tq_torch
from tq.errors import NotFoundError

from . import _kv
from ._calls import Call, both
from ._meta import BatchMeta
from ._rows import assemble, take_rows

__all__ = ["TransferQueueClient"]

_MODES = ("fetch", "insert", "force_fetch")

#: How long a fetched batch stays leased to its task before it is handed out again, unless
#: its data was read (``get_data``) or written (``put``) first: ``backend.tq.lease_seconds``.
DEFAULT_LEASE_SECONDS = 300.0


def _torch() -> Any:
    import torch

    return torch


def _names(fields: Union[str, Sequence[str]]) -> List[str]:
    return [fields] if isinstance(fields, str) else list(fields)


class TransferQueueClient:
    """A client of the deployment :func:`tq.compat.init` started or attached to.

    It wraps a :class:`tq.Client`; ``close()`` is the compat module's (closing a client
    from ``get_client()`` by hand leaves the module without one until the next ``init``).
    """

    def __init__(
        self,
        client: _tq.Client,
        client_id: Optional[str] = None,
        *,
        polling: bool = False,
        sampler: Optional[str] = None,
        lease: Optional[float] = DEFAULT_LEASE_SECONDS,
    ) -> None:
        self._client = client
        self.client_id = client_id or f"TransferQueueClient_{id(client):x}"
        #: ``controller.polling_mode``: a fetch answers at once, with what is ready.
        self.polling = polling
        #: The sampler fetches name (a sampler written in Python; ``None``: the default).
        self.sampler = sampler
        #: Seconds a fetched batch stays leased to its task until its data is read or written
        #: (acknowledged delivery); ``None``: consumed when fetched, as in the original.
        self.lease = lease

    @property
    def _native(self) -> Any:
        return self._client._native

    # -- metadata -----------------------------------------------------------------------------

    async def _get_meta(
        self,
        call: Call,
        data_fields: Sequence[str],
        batch_size: int,
        partition_id: str,
        mode: str = "fetch",
        task_name: Optional[str] = None,
        sampling_config: Optional[Mapping[str, Any]] = None,
    ) -> BatchMeta:
        """The metadata of a batch of ``partition_id``.

        ``mode="fetch"``: up to ``batch_size`` samples whose ``data_fields`` are produced and
        that ``task_name`` has not consumed, as the configured sampler picks them (it sees
        ``sampling_config``'s ``dp_rank`` and ``batch_index``); they are consumed. It waits
        for a full batch unless ``controller.polling_mode`` is on (then it may answer fewer,
        or none). ``"force_fetch"``: the first ``batch_size`` live samples, produced or
        not, consuming nothing. ``"insert"``: ``batch_size`` new samples to ``put`` into.
        """
        if mode not in _MODES:
            raise ValueError(f"get_meta: mode must be one of {sorted(_MODES)}, got {mode!r}")
        fields = _names(data_fields)
        config = dict(sampling_config or {})
        if mode == "fetch":
            if not task_name:
                raise ValueError("get_meta: a fetch needs a task_name")
            dp_rank, batch_index, inputs = _sampling_context(config, partition_id, task_name)
            native = await call(
                self._native.get_meta, partition_id, fields, "fetch", int(batch_size), task_name,
                0.0 if self.polling else None, self.sampler, dp_rank, batch_index, self.lease,
                None if not inputs else _sampler_args.dumps(inputs),
            )
            return BatchMeta.from_native(native, task=task_name)
        elif mode == "insert":
            native = await call(self._native.get_meta, partition_id, fields, "insert", int(batch_size))
        else:
            try:
                native = await call(self._native.get_meta, partition_id, fields, "force", 0)
            except NotFoundError:  # no such partition: nothing to show
                return BatchMeta.empty()
            if batch_size is not None and 0 < int(batch_size) < len(native):
                native = native.select_samples(list(range(int(batch_size))))
        return BatchMeta.from_native(native)

    get_meta, async_get_meta = both(_get_meta)

    async def _set_custom_meta(self, call: Call, metadata: BatchMeta) -> None:
        """Stores ``metadata.custom_meta`` (merged into each sample's tags) without data."""
        if metadata is None or metadata.size == 0:
            return
        for native, _rows in metadata.native_groups([]):
            await call(self._native.set_tags, native)

    set_custom_meta, async_set_custom_meta = both(_set_custom_meta)

    # -- data ---------------------------------------------------------------------------------

    async def _put(
        self,
        call: Call,
        data: Any,
        metadata: Optional[BatchMeta] = None,
        partition_id: Optional[str] = None,
        data_parser: Any = None,
    ) -> BatchMeta:
        """Writes ``data`` (a TensorDict, rows aligned with ``metadata``) into the samples
        ``metadata`` names, with their ``custom_meta``; without ``metadata``, into new samples
        of ``partition_id``. Returns the metadata with the written fields, all produced."""
        if metadata is None:
            if partition_id is None:
                raise ValueError("put: give metadata or a partition_id")
            columns = _convert.columns_in(data, self._native.is_embedded)
            native = await call(self._native.put_new, partition_id, columns)
            return BatchMeta.from_native(native)
        if metadata.size == 0:
            raise ValueError("put: metadata cannot be none or empty")
        rows = int(data.batch_size[0]) if hasattr(data, "batch_size") else None
        if rows is not None and rows != metadata.size:
            raise ValueError(f"put: {rows} rows of data for a BatchMeta of {metadata.size}")
        written = set(data.keys())
        kept = [f for f in metadata.field_names if f not in written]
        groups = metadata.native_groups([])
        # The same rows with the fields the put leaves alone, to unite with what it answers.
        before = metadata.native_groups(kept) if kept else [None] * len(groups)
        sources = list(metadata._sources)
        for (native, positions), old in zip(groups, before):
            part = data if positions == list(range(metadata.size)) else take_rows(data, positions)
            columns = _convert.columns_in(part, self._native.is_embedded)
            out = await call(self._native.put, native, columns)
            if old is not None:
                out = old[0].union(out)
            for j, i in enumerate(positions):
                sources[i] = (out, j, None)
        await self._acknowledge(call, metadata)
        metadata.add_fields(data)
        metadata._sources = sources
        return metadata

    put, async_put = both(_put)

    async def _get_data(self, call: Call, metadata: BatchMeta) -> Any:
        """The fields of ``metadata`` for its rows, in its order, as a TensorDict (ragged
        fields as nested tensors, other objects as a ``NonTensorStack``)."""
        if metadata is None or metadata.size == 0 or not metadata.field_names:
            return _tq_torch.tensordict_out({}, 0 if metadata is None else metadata.size)
        groups = metadata.native_groups()
        parts = []
        for native, positions in groups:
            got = await call(self._native.get_data, native, None)
            parts.append((positions, got))
        await self._acknowledge(call, metadata)
        if len(parts) == 1 and parts[0][0] == list(range(metadata.size)):
            return _convert.columns_out(parts[0][1], "tensordict")
        return _assemble(parts, metadata.size)

    get_data, async_get_data = both(_get_data)

    async def _acknowledge(self, call: Call, metadata: BatchMeta) -> None:
        """Consumes the rows of ``metadata`` a task fetched under a lease: their data was read
        or written, so they are not handed out again. Acknowledging twice changes nothing."""
        for task, native in metadata.leased():
            taken = await call(self._native.ack, task, native)
            if taken < len(native):
                warnings.warn(
                    f"partition `{native.partition}`: the lease of task `{task}` on {len(native) - taken} "
                    f"of {len(native)} samples ran out before they were read or written: they may have "
                    "been handed out again (raise backend.tq.lease_seconds)",
                    stacklevel=3,
                )

    async def _clear_samples(self, call: Call, metadata: BatchMeta) -> None:
        """Removes the samples of ``metadata`` (every field, tags, consumption)."""
        if metadata is None or metadata.size == 0:
            return
        for native, _rows in metadata.native_groups([]):
            await call(self._native.clear_samples, native)

    clear_samples, async_clear_samples = both(_clear_samples)

    async def _clear_partition(self, call: Call, partition_id: str) -> None:
        """Removes every sample of ``partition_id`` and the partition (nothing if it does not
        exist)."""
        await call(self._native.clear_partition, partition_id)

    clear_partition, async_clear_partition = both(_clear_partition)

    # -- status -------------------------------------------------------------------------------

    async def _get_consumption_status(self, call: Call, task_name: str, partition_id: str) -> Tuple[Any, Any]:
        """``(global indexes, consumed 0/1)`` as tensors, or ``(None, None)`` when the
        partition does not exist. A sample the task fetched counts as consumed from then on,
        as in the original, while its lease runs."""
        torch = _torch()
        try:
            status = await call(self._native.consumption_status, partition_id, task_name)
        except NotFoundError:
            return None, None
        # Leased counts as consumed: the task has taken the sample (it comes back only if the
        # lease runs out before its data is read or written).
        consumed = [1 if c or leased else 0 for c, leased in zip(status["consumed"], status["leased"])]
        return torch.tensor(status["global_indexes"], dtype=torch.long), torch.tensor(consumed, dtype=torch.int8)

    get_consumption_status, async_get_consumption_status = both(_get_consumption_status)

    async def _get_production_status(self, call: Call, data_fields: Sequence[str], partition_id: str) -> Tuple[Any, Any]:
        """``(global indexes, produced 0/1 per sample and field)`` as tensors, or ``(None,
        None)`` when the partition does not exist."""
        torch = _torch()
        fields = _names(data_fields)
        try:
            status = await call(self._native.production_status, partition_id, fields)
        except NotFoundError:
            return None, None
        rows = [[1 if p else 0 for p in row] for row in status["produced"]]
        matrix = torch.tensor(rows, dtype=torch.int8).reshape(len(rows), len(fields))
        return torch.tensor(status["global_indexes"], dtype=torch.long), matrix

    get_production_status, async_get_production_status = both(_get_production_status)

    async def _check_consumption_status(self, call: Call, task_name: str, partition_id: str) -> bool:
        """Whether ``task_name`` consumed every sample of the partition (``False`` when it is
        missing or empty)."""
        _, consumed = await self._get_consumption_status(call, task_name, partition_id)
        return consumed is not None and len(consumed) > 0 and bool(consumed.all())

    check_consumption_status, async_check_consumption_status = both(_check_consumption_status)

    async def _check_production_status(self, call: Call, data_fields: Sequence[str], partition_id: str) -> bool:
        """Whether every sample has every one of ``data_fields`` (``False`` when the partition
        is missing or empty)."""
        _, produced = await self._get_production_status(call, data_fields, partition_id)
        return produced is not None and produced.shape[0] > 0 and bool(produced.all())

    check_production_status, async_check_production_status = both(_check_production_status)

    async def _reset_consumption(self, call: Call, partition_id: str, task_name: Optional[str] = None) -> bool:
        """Forgets what ``task_name`` (every task, with ``None``) consumed; ``True``."""
        await call(self._native.reset_consumption, partition_id, task_name)
        return True

    reset_consumption, async_reset_consumption = both(_reset_consumption)

    async def _get_partition_list(self, call: Call) -> List[str]:
        """The partitions, in creation order."""
        return list(await call(self._native.list_partitions))

    get_partition_list, async_get_partition_list = both(_get_partition_list)

    # -- keys ---------------------------------------------------------------------------------

    async def _kv_retrieve_meta(self, call: Call, keys: Union[str, Sequence[str]], partition_id: str, create: bool = False) -> BatchMeta:
        """The metadata of ``keys`` (rows in their order). A missing key raises
        :class:`StorageKeyNotFoundError`, or, with ``create``, gets a new sample."""
        keys = _key_list(keys)
        native = await call(self._native.kv_meta, partition_id, keys, bool(create))
        return BatchMeta.from_native(native)

    kv_retrieve_meta, async_kv_retrieve_meta = both(_kv_retrieve_meta)

    async def _kv_retrieve_keys(self, call: Call, global_indexes: Union[int, Sequence[int]], partition_id: str) -> List[Optional[str]]:
        """The key of each global index (``None`` for an index no key of the partition has)."""
        if isinstance(global_indexes, bool) or not isinstance(global_indexes, (int, list, tuple)):
            raise TypeError("kv_retrieve_keys: global_indexes must be an int or a list of ints")
        wanted = [global_indexes] if isinstance(global_indexes, int) else list(global_indexes)
        if not wanted:
            raise ValueError("kv_retrieve_keys: no global indexes given")
        if any(isinstance(g, bool) or not isinstance(g, int) for g in wanted):
            raise TypeError("kv_retrieve_keys: global indexes are ints")
        if partition_id not in await call(self._native.list_partitions):
            return [None] * len(wanted)
        keys = [k for k, _tags in await call(self._native.kv_list, partition_id)]
        by_index: Dict[int, str] = {}
        if keys:
            native = await call(self._native.kv_meta, partition_id, keys, False)
            by_index = dict(zip(native.global_indexes, keys))
        return [by_index.get(g) for g in wanted]

    kv_retrieve_keys, async_kv_retrieve_keys = both(_kv_retrieve_keys)

    async def _kv_list(self, call: Call, partition_id: Optional[str] = None) -> Dict[str, Dict[str, Dict[str, Any]]]:
        """``{partition_id: {key: tags}}`` for one partition (``{}`` when it does not exist) or
        every one."""
        return await _kv.kv_list(call, self._native, partition_id)

    kv_list, async_kv_list = both(_kv_list)

    def close(self) -> None:
        """Closes the connection (the deployment keeps running)."""
        self._client.close()

    def __repr__(self) -> str:
        return f"TransferQueueClient({self.client_id!r})"


#: The sampling_config entries that are the fetch's context (the dataloader's own keys).
_CONTEXT_KEYS = {"dp_rank", "batch_index", "task_name", "partition_id"}


def _sampling_context(
    config: Mapping[str, Any], partition_id: str, task_name: str
) -> Tuple[Optional[int], Optional[int], Dict[str, Any]]:
    """``(dp_rank, batch_index, inputs)`` of a sampling_config: the typed context, and the
    other entries (priority scores, ...), which travel with the fetch to a sampler written in
    Python as keywords. tq's built-in samplers take no inputs and refuse a fetch that brings
    some, so a sampler never chooses without inputs it was given."""
    inputs = {k: v for k, v in config.items() if k not in _CONTEXT_KEYS}
    for key, want in (("partition_id", partition_id), ("task_name", task_name)):
        if key in config and config[key] != want:
            raise ValueError(f"get_meta: sampling_config {key} {config[key]!r} differs from the request's {want!r}")
    dp_rank, batch_index = config.get("dp_rank"), config.get("batch_index")
    return (None if dp_rank is None else int(dp_rank)), (None if batch_index is None else int(batch_index)), inputs


def _key_list(keys: Union[str, Sequence[str]]) -> List[str]:
    if isinstance(keys, str):
        return [keys]
    if not isinstance(keys, (list, tuple)):
        raise TypeError(f"keys must be a str or a list of str, got {type(keys).__name__}")
    keys = list(keys)
    if not keys:
        raise ValueError("no keys given")
    if not all(isinstance(k, str) for k in keys):
        raise TypeError("keys must be str")
    return keys


def _assemble(parts: List[Tuple[List[int], Any]], rows: int) -> Any:
    """One TensorDict from the reads of several partitions: row ``positions[j]`` of the
    result is row ``j`` of that part."""
    return assemble([(positions, _convert.columns_out(native, "torch")) for positions, native in parts], rows)
