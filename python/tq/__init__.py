"""tq: a streaming sample store for reinforcement-learning post-training.

``tq.Client.embedded()`` runs a controller and storage units inside this process;
``tq.connect(url)`` attaches to a running deployment (``tq serve``). Both give a
:class:`Client`, whose :meth:`Client.partition` handles carry the KV API and the metadata API
(``put`` / ``fetch`` / :meth:`Client.get_data`)::

    import numpy as np
    import tq

    with tq.Client.embedded() as client:
        train = client.partition("train")
        train.kv_batch_put(["a", "b"], {"input_ids": np.arange(6).reshape(2, 3)})
        back = train.kv_batch_get(["b", "a"])
        back["input_ids"]        # one numpy array viewing tq's buffer, rows in key order

Errors are the classes of :mod:`tq.errors`, all derived from :class:`TqError`.
"""

from __future__ import annotations

import json
import os
from typing import Any, AsyncIterator, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

from . import _aio, _convert, _sampler_args
from . import stream as _stream
try:
    from ._native import BatchMeta, Buffer, NativeClient, NativeServer, NativeUnit
    from ._native import install_metrics as _native_install_metrics
except ImportError as _missing:
    # With no compiled module beside this file, Python imported the source tree (a script run
    # from the repository's `python` directory, or a Ray worker started there: Ray puts the
    # driver's working directory first on its workers' path) instead of the installed package.
    # A compiled module that is there but fails to load keeps its own error.
    if any(n.startswith("_native") and not n.endswith(".pyi") for n in os.listdir(os.path.dirname(os.path.abspath(__file__)))):
        raise
    raise ImportError(
        f"tq's compiled module (tq._native) cannot be imported from {os.path.dirname(os.path.abspath(__file__))}: "
        "this looks like tq's source tree rather than an installed package. Install it with "
        "`pip install ./python` from the repository's root, and run scripts from a directory that "
        "has no `tq` folder of tq's sources in it (under Ray also the driver's working directory, "
        f"which Ray's workers import from). ({_missing})"
    ) from _missing
from .errors import *  # noqa: F401,F403 (the exception classes are part of the package API)
from .errors import TqError, __all__ as _error_names

__all__ = [
    "Client",
    "Partition",
    "BatchMeta",
    "Buffer",
    "Server",
    "StreamingDataset",
    "connect",
    "serve",
    "serve_unit",
    "UnitServer",
    "install_metrics",
    "__version__",
    *_error_names,
]

from ._native import __version__


def install_metrics() -> None:
    """Installs this process's Prometheus exporter (once; later calls do nothing), so that
    :meth:`Client.metrics_text` shows request counters and latencies. Deployments and clients
    built before the call do not record (they take their metric handles when built): call it
    first."""
    _native_install_metrics()


def __getattr__(name: str) -> Any:
    # `tq.StreamingDataset` is a torch IterableDataset when torch is installed (so DataLoader
    # takes it as one), and a plain iterable otherwise; torch is imported only when asked for.
    if name == "StreamingDataset":
        try:
            dataset = _stream.torch_dataset_class()
        except ImportError:
            dataset = _stream.StreamingDataset
        globals()[name] = dataset
        return dataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: What ``config`` may be: a dict of sections (as in tq's TOML), the path of a TOML file, or
#: ``None`` for the defaults. Keyword arguments add or replace sections.
ConfigLike = Union[None, Mapping[str, Any], str, "os.PathLike[str]"]


def _config_form(config: ConfigLike, sections: Mapping[str, Any]) -> tuple:
    """The configuration as the native module takes it: ``(form, text)``."""
    if config is None and not sections:
        return ("default", "")
    if isinstance(config, (str, os.PathLike)):
        if sections:
            raise TypeError("give either a configuration file or keyword sections, not both")
        return ("path", os.fspath(config))
    merged: Dict[str, Any] = dict(config or {})
    merged.update(sections)
    return ("json", json.dumps(merged))


class _Closable:
    """What a handle on a native object that must be closed shares: ``closed``, and the
    context manager that closes it."""

    __slots__ = ()
    _native: Any

    def close(self) -> None:  # pragma: no cover - every subclass says what closing means
        self._native.close()

    @property
    def closed(self) -> bool:
        return self._native.closed

    def __enter__(self: "_C") -> "_C":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_C = TypeVar("_C", bound=_Closable)


class Client(_Closable):
    """A connection to tq: embedded (:meth:`embedded`) or to a deployment (:func:`connect`).

    A client is safe to share between threads; every call releases the GIL while it waits or
    moves data. Close it with :meth:`close` or use it as a context manager.
    """

    __slots__ = ("_native",)

    def __init__(self, native: NativeClient) -> None:
        self._native = native

    @classmethod
    def embedded(cls, config: ConfigLike = None, **sections: Any) -> "Client":
        """Everything in this process: a controller and storage units, no servers.

        ``config`` is a dict of sections, the path of a TOML file, or ``None``; keyword
        arguments give sections (``Client.embedded(storage={"num_units": 4})``). The
        environment's ``TQ_*`` variables override both, as for the ``tq`` command.
        """
        form, text = _config_form(config, sections)
        return cls(NativeClient.embedded(form, text))

    def partition(self, name: str) -> "Partition":
        """A handle on partition ``name`` (created on first write)."""
        if not isinstance(name, str) or not name:
            raise TypeError("a partition name is a non-empty str")
        return Partition(self, name)

    def list_partitions(self) -> List[str]:
        """Partition names, in creation order."""
        return self._native.list_partitions()

    # -- metadata API ---------------------------------------------------------------------

    def get_data(self, meta: BatchMeta, fields: Optional[Sequence[str]] = None, *, format: str = "numpy") -> Any:
        """The payloads of ``meta``'s samples (only ``fields``, if given), rows in ``meta``'s
        order, as :meth:`Partition.kv_batch_get` returns them (``format`` likewise)."""
        names = None if fields is None else list(fields)
        return _convert.columns_out(self._native.get_data(meta, names), format)

    def put(self, meta: BatchMeta, fields: Mapping[str, Any], *, copy: Optional[bool] = None) -> BatchMeta:
        """Writes ``fields`` into the samples ``meta`` names (row ``i`` into sample ``i``): how
        a stage fills in the fields it produces. Returns the samples with those fields.
        ``copy`` as in :meth:`Partition.kv_batch_put`."""
        return self._native.put(meta, _convert.columns_in(fields, self._native.is_embedded, copy))

    def clear_samples(self, meta: BatchMeta) -> None:
        """Removes ``meta``'s samples: payloads, metadata and consumption."""
        self._native.clear_samples(meta)

    def set_tags(self, meta: BatchMeta) -> None:
        """Merges ``meta.tags`` into its samples without writing data (samples cleared since
        ``meta`` was made are skipped)."""
        self._native.set_tags(meta)

    def ack(self, task: str, meta: BatchMeta) -> int:
        """Consumes samples that ``task`` fetched with a lease; returns how many this lease
        acknowledged (a repeat answers the same, so retrying is safe; fewer than ``len(meta)``
        means the lease ran out and the rest may be another consumer's now)."""
        return self._native.ack(task, meta)

    def renew_lease(self, task: str, meta: BatchMeta, seconds: float) -> int:
        """Keeps samples that ``task`` fetched with a lease leased for ``seconds`` from now,
        for a step that takes longer than the lease it fetched with; returns how many were
        still held (fewer than ``len(meta)``: the rest's lease ran out, or they were
        acknowledged). Safe to repeat."""
        return self._native.renew_lease(task, meta, seconds)

    def status(self) -> Dict[str, Any]:
        """What the deployment holds, as ``tq stats`` shows it: ``{"storage_backend",
        "controller": {partitions, index use, leases, ...}, "units": [...]}``."""
        return self._native.status()

    def metrics_text(self) -> str:
        """This process's metrics in the Prometheus text format: the request metrics recorded
        since :func:`install_metrics` (none before it), then the deployment's state gauges
        (partitions, progress, units), computed now."""
        return self._native.metrics_text()

    def save_checkpoint(self, path: Union[str, "os.PathLike[str]"]) -> Dict[str, Any]:
        """Saves the controller's state (and, for storage units, the payloads) into the
        directory ``path``; returns the checkpoint's manifest (format, epoch, counts, files)."""
        return self._native.save_checkpoint(os.fspath(path))

    def load_checkpoint(self, path: Union[str, "os.PathLike[str]"]) -> Dict[str, Any]:
        """Restores the checkpoint in ``path`` into this client's deployment, which must hold
        no partition yet. Everything is checked before anything changes; an error names the
        file at fault. Returns the manifest."""
        return self._native.load_checkpoint(os.fspath(path))

    # -- asyncio: the same operations as coroutines, driven by tq's runtime -----------------

    async def async_list_partitions(self) -> List[str]:
        """:meth:`list_partitions` as a coroutine."""
        return await _aio.run(lambda done: self._native.list_partitions(done=done))

    async def async_status(self) -> Dict[str, Any]:
        """:meth:`status` as a coroutine."""
        return await _aio.run(lambda done: self._native.status(done=done))

    async def async_save_checkpoint(self, path: Union[str, "os.PathLike[str]"]) -> Dict[str, Any]:
        """:meth:`save_checkpoint` as a coroutine (once started, it runs to its end)."""
        where = os.fspath(path)
        return await _aio.run(lambda done: self._native.save_checkpoint(where, done=done))

    async def async_load_checkpoint(self, path: Union[str, "os.PathLike[str]"]) -> Dict[str, Any]:
        """:meth:`load_checkpoint` as a coroutine (once started, it runs to its end)."""
        where = os.fspath(path)
        return await _aio.run(lambda done: self._native.load_checkpoint(where, done=done))

    async def async_get_data(self, meta: BatchMeta, fields: Optional[Sequence[str]] = None, *, format: str = "numpy") -> Any:
        """:meth:`get_data` as a coroutine."""
        names = None if fields is None else list(fields)
        native = await _aio.run(lambda done: self._native.get_data(meta, names, done=done))
        return _convert.columns_out(native, format)

    async def async_put(self, meta: BatchMeta, fields: Mapping[str, Any], *, copy: Optional[bool] = None) -> BatchMeta:
        """:meth:`put` as a coroutine."""
        columns = _convert.columns_in(fields, self._native.is_embedded, copy)
        return await _aio.run(lambda done: self._native.put(meta, columns, done=done))

    async def async_clear_samples(self, meta: BatchMeta) -> None:
        """:meth:`clear_samples` as a coroutine."""
        await _aio.run(lambda done: self._native.clear_samples(meta, done=done))

    async def async_ack(self, task: str, meta: BatchMeta) -> int:
        """:meth:`ack` as a coroutine."""
        return await _aio.run(lambda done: self._native.ack(task, meta, done=done))

    async def async_renew_lease(self, task: str, meta: BatchMeta, seconds: float) -> int:
        """:meth:`renew_lease` as a coroutine."""
        return await _aio.run(
            lambda done: self._native.renew_lease(task, meta, seconds, done=done)
        )

    def close(self) -> None:
        """Closes the client (and, when embedded, the store with it). Closing twice is fine."""
        self._native.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<tq.Client {self._native!r} {state}>"


def connect(url: str, token: Optional[str] = None, config: ConfigLike = None, **sections: Any) -> Client:
    """A client of the deployment at ``url`` (``tcp://host:port``, as ``tq serve`` prints).

    ``token`` is the deployment's shared secret, if it has one (``TQ_NET_TOKEN`` works too).
    """
    form, text = _config_form(config, sections)
    return Client(NativeClient.connect(url, form, text, token))


class Server(_Closable):
    """A deployment hosted by this process (a controller and storage units serving over TCP):
    what :func:`serve` answers. Other processes reach it with ``tq.connect(server.url)``.
    Close it with :meth:`close` or use it as a context manager; its data goes with it."""

    __slots__ = ("_native",)

    def __init__(self, native: NativeServer) -> None:
        self._native = native

    @property
    def url(self) -> str:
        """Where clients connect (``tcp://host:port``)."""
        return self._native.url

    @property
    def units(self) -> List[tuple]:
        """Each storage unit's ``(id, endpoint)``."""
        return self._native.units

    def connect(self, token: Optional[str] = None) -> Client:
        """A client of this deployment."""
        return connect(self.url, token=token)

    def local_client(self) -> Client:
        """A client in this process that calls the controller and the storage units directly,
        with no socket in between: an embedded client's speed, seeing the same state as every
        client connected to :attr:`url`. What the process hosting a deployment should use
        itself. Closing it leaves the deployment serving. :class:`UnsupportedError` when the
        units are elsewhere (``remote_units=True``) or the storage is shared (a KV store):
        use :meth:`connect` then."""
        return Client(self._native.local_client())

    def close(self) -> None:
        """Stops serving (connections end, the units stop). Closing twice is fine."""
        self._native.close()

    def __repr__(self) -> str:
        return f"<tq.Server {self.url} {len(self.units)} units{' closed' if self.closed else ''}>"


def serve(
    config: ConfigLike = None,
    *,
    listen: str = "tcp://127.0.0.1:0",
    units: Optional[int] = None,
    unit_host: Optional[str] = None,
    advertise_host: Optional[str] = None,
    capacity_per_unit: Optional[int] = None,
    default_sampler: Optional[str] = None,
    insecure: bool = False,
    remote_units: bool = False,
    samplers: Optional[Mapping[str, Any]] = None,
    **sections: Any,
) -> Server:
    """Hosts a deployment in this process, as ``tq serve`` does: a controller on ``listen``
    (port 0 picks a free one) and ``units`` storage units (default ``storage.num_units``) on
    free ports of ``unit_host``. A non-loopback address needs a token (``net.token`` or
    ``TQ_NET_TOKEN``) unless ``insecure``. The configuration is as for
    :meth:`Client.embedded`; its samplers are the controller's. The servers run on a thread
    of their own (``net.server_threads`` threads: one by default), never the caller's.

    With ``remote_units``, the units run elsewhere: this process serves the controller alone,
    and the ``units`` storage units register with it (:func:`serve_unit`, ``tq storage-unit``)
    before clients can use it.

    ``samplers`` registers samplers written in Python under names a fetch can give
    (``fetch(..., sampler=name)``): objects with ``sample(ready, batch_size, *, partition_id,
    task_name, dp_rank=None, batch_index=None) -> (sampled, consumed)``, both lists of global
    indexes taken from ``ready`` (``tq.compat.BaseSampler`` is such a class). The controller
    calls them with the GIL, inside its critical section: keep them quick.
    """
    form, text = _config_form(config, sections)
    named = None if samplers is None else [(str(k), v) for k, v in samplers.items()]
    return Server(
        NativeServer.start(
            form, text, listen, units, unit_host, advertise_host, capacity_per_unit, default_sampler, insecure,
            remote_units, named,
        )
    )


class UnitServer(_Closable):
    """One storage unit hosted by this process and registered with a controller elsewhere:
    what :func:`serve_unit` answers. Its data goes with it when it closes."""

    __slots__ = ("_native",)

    def __init__(self, native: NativeUnit) -> None:
        self._native = native

    @property
    def id(self) -> str:
        """The unit's id (``unit-<i>`` holds the samples whose index is ``i`` modulo the
        number of units)."""
        return self._native.id

    @property
    def endpoint(self) -> str:
        """Where clients reach the unit (``tcp://host:port``)."""
        return self._native.endpoint

    def close(self) -> None:
        """Stops serving. Closing twice is fine."""
        self._native.close()

    def __repr__(self) -> str:
        return f"<tq.UnitServer {self.id} {self.endpoint}{' closed' if self.closed else ''}>"


def serve_unit(
    controller: str,
    id: str,
    config: ConfigLike = None,
    *,
    listen: str = "tcp://127.0.0.1:0",
    advertise: Optional[str] = None,
    capacity: Optional[int] = None,
    insecure: bool = False,
    **sections: Any,
) -> UnitServer:
    """Hosts storage unit ``id`` (``unit-0``, ``unit-1``, ...) in this process and registers it
    with the controller at ``controller`` (a :func:`serve` with ``remote_units``, or
    ``tq controller``), as ``tq storage-unit`` does; it keeps registering, so a restarted
    controller finds it again. Registration is retried for 30 s while the controller is not
    reachable. ``advertise`` is the endpoint clients use when it is not ``listen``'s. The
    configuration (its ``net.token`` above all) is as for :func:`serve`.
    """
    form, text = _config_form(config, sections)
    return UnitServer(NativeUnit.start(form, text, controller, id, listen, advertise, capacity, insecure))


class Partition:
    """One partition of a :class:`Client`: its KV API.

    Fields are given as a mapping of field name to values: a numpy array whose first dimension
    is the batch (dense), a list of arrays (ragged, one per row), or a list of Python objects.
    """

    __slots__ = ("_client", "name")

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        #: The partition's name.
        self.name = name

    @property
    def _native(self) -> NativeClient:
        return self._client._native

    def kv_put(
        self, key: str, fields: Mapping[str, Any], tags: Optional[Mapping[str, Any]] = None, *, copy: Optional[bool] = None
    ) -> None:
        """Writes one key: ``fields`` maps field names to one row's value each (``copy`` as
        in :meth:`kv_batch_put`)."""
        rows = {name: _convert.row_in(name, value) for name, value in fields.items()}
        self.kv_batch_put([key], rows, None if tags is None else [tags], copy=copy)

    def kv_batch_put(
        self,
        keys: Sequence[str],
        fields: Mapping[str, Any],
        tags: Optional[Sequence[Mapping[str, Any]]] = None,
        *,
        copy: Optional[bool] = None,
    ) -> None:
        """Writes several keys at once (created on first use): row ``i`` of every field and
        ``tags[i]`` belong to ``keys[i]``. Nothing changes if anything is refused.

        ``copy``: ``None`` (the default) copies arrays into tq's buffer for an embedded client
        and sends them from where they are for a connected one; ``False`` hands C-contiguous
        arrays over without a copy even when embedded (the store keeps them, so numpy arrays
        are made read-only); ``True`` always copies. See docs/python.md, "Copies"."""
        keys = _convert.keys_in(keys)
        columns = _convert.columns_in(fields, self._native.is_embedded, copy)
        self._native.kv_batch_put(self.name, keys, columns, None if tags is None else [dict(t) for t in tags])

    def kv_batch_get(
        self, keys: Sequence[str], fields: Optional[Sequence[str]] = None, *, format: str = "numpy"
    ) -> Any:
        """Reads keys; rows follow ``keys``' order. Without ``fields``, the fields every key
        holds. A dense field comes back as **one** numpy array that views tq's buffer (no
        copy): writable when the buffer is this read's alone, read-only when tq shares it
        (copy it, ``a.copy()``, to change it). ``format="torch"`` gives torch tensors (nested
        ones for ragged fields), ``"tensordict"`` one TensorDict; see docs/python.md."""
        keys = _convert.keys_in(keys)
        names = None if fields is None else list(fields)
        return _convert.columns_out(self._native.kv_batch_get(self.name, keys, names), format)

    def kv_get(self, key: str, fields: Optional[Sequence[str]] = None, *, format: str = "numpy") -> Dict[str, Any]:
        """Reads one key: field name → that key's value (a dense field's row, a ragged
        field's array, or the object)."""
        got = self.kv_batch_get([key], fields, format="torch" if format == "tensordict" else format)
        return {name: value[0] for name, value in got.items()}

    def kv_list(self) -> Dict[str, Dict[str, Any]]:
        """The partition's keys, each with its tags (an empty dict when it does not exist)."""
        return {key: tags for key, tags in self._native.kv_list(self.name)}

    def kv_clear(self, keys: Sequence[str]) -> None:
        """Removes keys (fields, tags, consumption); keys that do not exist are skipped."""
        self._native.kv_clear(self.name, _convert.keys_in(keys))

    def kv_clear_fields(self, keys: Sequence[str], fields: Sequence[str]) -> None:
        """Removes the cells of ``fields`` of ``keys``; the keys and their other fields stay."""
        self._native.kv_clear_fields(self.name, _convert.keys_in(keys), list(fields))

    def kv_set_tags(self, keys: Sequence[str], tags: Sequence[Mapping[str, Any]]) -> None:
        """Merges ``tags[i]`` into the tags of ``keys[i]`` (creating keys that do not exist),
        writing no field."""
        self._native.kv_set_tags(self.name, _convert.keys_in(keys), [dict(t) for t in tags])

    def kv_tags(self, keys: Sequence[str]) -> List[Dict[str, Any]]:
        """The tags of ``keys``, in order."""
        return self._native.kv_tags(self.name, _convert.keys_in(keys))

    def kv_update(self, keys: Sequence[str], fields: Mapping[str, Any], merge: str = "replace", *, dim: int = 0) -> None:
        """Merges ``fields`` (rows as in :meth:`kv_batch_put`) into the cells of ``keys``:
        ``merge`` is ``"replace"``, ``"add"``, ``"max"``, ``"concat"`` (along ``dim`` of each
        row), or the name of a merge function registered with the storage. A key or field
        not written yet takes the value as it is."""
        keys = _convert.keys_in(keys)
        self._native.kv_batch_update(self.name, keys, _convert.columns_in(fields, self._native.is_embedded), merge, dim)

    def kv_link(
        self,
        keys: Sequence[str],
        public_keys: Sequence[str],
        fields: Sequence[str],
        *,
        public_partition: Optional[str] = None,
        replace_private: bool = False,
    ) -> None:
        """Makes ``fields`` of ``keys[i]`` read the payload of ``public_keys[i]`` in the public
        partition (``"__public__"`` or ``"__public__/<namespace>"``) without copying it: a
        prompt shared by a group's responses is stored once. ``replace_private`` clears a
        payload a destination field holds itself instead of refusing the link."""
        self._native.kv_link(
            self.name, _convert.keys_in(keys), _convert.keys_in(public_keys), list(fields), public_partition, replace_private
        )

    def kv_unlink(self, keys: Sequence[str], fields: Sequence[str]) -> int:
        """Drops the links of ``fields`` of ``keys`` (the cells read as never written); returns
        how many links there were."""
        return self._native.kv_unlink(self.name, _convert.keys_in(keys), list(fields))

    # -- metadata API ---------------------------------------------------------------------

    def put(self, fields: Mapping[str, Any], *, copy: Optional[bool] = None) -> BatchMeta:
        """Writes ``fields`` into new samples (one per row); returns their metadata. ``copy``
        as in :meth:`kv_batch_put`."""
        return self._native.put_new(self.name, _convert.columns_in(fields, self._native.is_embedded, copy))

    def fetch(
        self,
        fields: Sequence[str],
        task: str,
        batch_size: int,
        *,
        timeout: Optional[float] = None,
        sampler: Optional[str] = None,
        lease: Optional[float] = None,
        sampler_args: Optional[Mapping[str, Any]] = None,
    ) -> BatchMeta:
        """Takes up to ``batch_size`` samples whose ``fields`` are produced and that ``task``
        has not consumed yet, oldest first (or as ``sampler`` picks), and marks them consumed.

        Waits for a full batch up to ``timeout`` seconds (``None``: the configured
        ``controller.fetch_timeout_ms``; ``0``: answers at once, possibly empty) and raises
        :class:`tq.TimeoutError` after that. A complete partition gives its last, smaller
        batch, then :class:`tq.ClosedError`. With ``lease`` (seconds), the samples are only
        reserved until :meth:`Client.ack`, and come back to the task if the lease runs out.
        The wait releases the GIL, and Ctrl-C interrupts it. ``sampler_args`` (names →
        plain values or numpy arrays) are this call's inputs for a sampler written in Python,
        passed to its ``sample`` as keywords; any other sampler refuses them
        (:class:`InvalidError`).
        """
        return self.get_meta(
            fields, "fetch", batch_size, task, timeout=timeout, sampler=sampler, lease=lease, sampler_args=sampler_args
        )

    def get_meta(
        self,
        fields: Sequence[str],
        mode: str,
        batch_size: int = 0,
        task: Optional[str] = None,
        *,
        timeout: Optional[float] = None,
        sampler: Optional[str] = None,
        dp_rank: Optional[int] = None,
        batch_index: Optional[int] = None,
        lease: Optional[float] = None,
        sampler_args: Optional[Mapping[str, Any]] = None,
    ) -> BatchMeta:
        """The general metadata request that :meth:`fetch` and :meth:`put` are made of.

        ``mode="fetch"``: as :meth:`fetch` for ``task``, with the sampler's ``dp_rank`` and
        ``batch_index`` (rank-aware samplers hand every rank of a step the same batch) and
        ``lease`` (seconds; acknowledged delivery, as for :meth:`fetch`) and ``sampler_args``
        (as for :meth:`fetch`).
        ``mode="insert"``: ``batch_size`` new samples that will hold ``fields``, for a
        :meth:`Client.put` (a clear removes them even if that put never comes).
        ``mode="force"``: every live sample, with its production of ``fields``; nothing is
        consumed.
        """
        encoded = None if sampler_args is None else _sampler_args.dumps(sampler_args)
        return self._native.get_meta(
            self.name, list(fields), mode, batch_size, task, timeout, sampler, dp_rank, batch_index, lease, encoded
        )

    def kv_meta(self, keys: Sequence[str], *, create: bool = False) -> BatchMeta:
        """The metadata of ``keys`` (rows in their order) for :meth:`Client.get_data`,
        :meth:`Client.put` and :meth:`Client.clear_samples`. A key the partition does not
        hold raises :class:`NotFoundError`, or, with ``create``, gets a new sample."""
        return self._native.kv_meta(self.name, _convert.keys_in(keys), create)

    def production_status(self, fields: Sequence[str]) -> Dict[str, Any]:
        """Which of ``fields`` each sample has: ``{"global_indexes": [...], "fields": [...],
        "produced": [[bool per field] per sample]}``."""
        return self._native.production_status(self.name, list(fields))

    def consumption_status(self, task: str) -> Dict[str, Any]:
        """What ``task`` consumed: ``{"global_indexes", "consumed", "leased"}``, a list each."""
        return self._native.consumption_status(self.name, task)

    def reset_consumption(self, task: Optional[str] = None) -> None:
        """Forgets what ``task`` (every task, if ``None``) consumed, so it sees every sample
        again."""
        self._native.reset_consumption(self.name, task)

    def complete(self) -> None:
        """Declares that no more samples will be added: consumers end once they took all."""
        self._native.complete(self.name)

    def clear(self) -> None:
        """Clears every sample and drops the partition."""
        self._native.clear_partition(self.name)

    # -- asyncio: the same operations as coroutines, driven by tq's runtime -----------------
    # Cancelling one (``task.cancel()``, a timeout) cancels the operation: what it had not
    # done yet is not done.

    async def async_kv_put(
        self, key: str, fields: Mapping[str, Any], tags: Optional[Mapping[str, Any]] = None, *, copy: Optional[bool] = None
    ) -> None:
        """:meth:`kv_put` as a coroutine."""
        rows = {name: _convert.row_in(name, value) for name, value in fields.items()}
        await self.async_kv_batch_put([key], rows, None if tags is None else [tags], copy=copy)

    async def async_kv_batch_put(
        self,
        keys: Sequence[str],
        fields: Mapping[str, Any],
        tags: Optional[Sequence[Mapping[str, Any]]] = None,
        *,
        copy: Optional[bool] = None,
    ) -> None:
        """:meth:`kv_batch_put` as a coroutine."""
        keys = _convert.keys_in(keys)
        columns = _convert.columns_in(fields, self._native.is_embedded, copy)
        tag_list = None if tags is None else [dict(t) for t in tags]
        await _aio.run(lambda done: self._native.kv_batch_put(self.name, keys, columns, tag_list, done=done))

    async def async_kv_batch_get(
        self, keys: Sequence[str], fields: Optional[Sequence[str]] = None, *, format: str = "numpy"
    ) -> Any:
        """:meth:`kv_batch_get` as a coroutine."""
        keys = _convert.keys_in(keys)
        names = None if fields is None else list(fields)
        native = await _aio.run(lambda done: self._native.kv_batch_get(self.name, keys, names, done=done))
        return _convert.columns_out(native, format)

    async def async_kv_get(self, key: str, fields: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """:meth:`kv_get` as a coroutine."""
        got = await self.async_kv_batch_get([key], fields)
        return {name: value[0] for name, value in got.items()}

    async def async_kv_list(self) -> Dict[str, Dict[str, Any]]:
        """:meth:`kv_list` as a coroutine."""
        pairs = await _aio.run(lambda done: self._native.kv_list(self.name, done=done))
        return {key: tags for key, tags in pairs}

    async def async_kv_clear(self, keys: Sequence[str]) -> None:
        """:meth:`kv_clear` as a coroutine."""
        keys = _convert.keys_in(keys)
        await _aio.run(lambda done: self._native.kv_clear(self.name, keys, done=done))

    async def async_kv_clear_fields(self, keys: Sequence[str], fields: Sequence[str]) -> None:
        """:meth:`kv_clear_fields` as a coroutine."""
        keys, names = _convert.keys_in(keys), list(fields)
        await _aio.run(lambda done: self._native.kv_clear_fields(self.name, keys, names, done=done))

    async def async_kv_set_tags(self, keys: Sequence[str], tags: Sequence[Mapping[str, Any]]) -> None:
        """:meth:`kv_set_tags` as a coroutine."""
        keys, tag_list = _convert.keys_in(keys), [dict(t) for t in tags]
        await _aio.run(lambda done: self._native.kv_set_tags(self.name, keys, tag_list, done=done))

    async def async_kv_tags(self, keys: Sequence[str]) -> List[Dict[str, Any]]:
        """:meth:`kv_tags` as a coroutine."""
        keys = _convert.keys_in(keys)
        return await _aio.run(lambda done: self._native.kv_tags(self.name, keys, done=done))

    async def async_kv_update(self, keys: Sequence[str], fields: Mapping[str, Any], merge: str = "replace", *, dim: int = 0) -> None:
        """:meth:`kv_update` as a coroutine."""
        keys, columns = _convert.keys_in(keys), _convert.columns_in(fields, self._native.is_embedded)
        await _aio.run(lambda done: self._native.kv_batch_update(self.name, keys, columns, merge, dim, done=done))

    async def async_kv_link(
        self,
        keys: Sequence[str],
        public_keys: Sequence[str],
        fields: Sequence[str],
        *,
        public_partition: Optional[str] = None,
        replace_private: bool = False,
    ) -> None:
        """:meth:`kv_link` as a coroutine."""
        keys, public, names = _convert.keys_in(keys), _convert.keys_in(public_keys), list(fields)
        await _aio.run(
            lambda done: self._native.kv_link(self.name, keys, public, names, public_partition, replace_private, done=done)
        )

    async def async_kv_unlink(self, keys: Sequence[str], fields: Sequence[str]) -> int:
        """:meth:`kv_unlink` as a coroutine."""
        keys, names = _convert.keys_in(keys), list(fields)
        return await _aio.run(lambda done: self._native.kv_unlink(self.name, keys, names, done=done))

    async def async_put(self, fields: Mapping[str, Any], *, copy: Optional[bool] = None) -> BatchMeta:
        """:meth:`put` as a coroutine."""
        columns = _convert.columns_in(fields, self._native.is_embedded, copy)
        return await _aio.run(lambda done: self._native.put_new(self.name, columns, done=done))

    async def async_fetch(
        self,
        fields: Sequence[str],
        task: str,
        batch_size: int,
        *,
        timeout: Optional[float] = None,
        sampler: Optional[str] = None,
        lease: Optional[float] = None,
        sampler_args: Optional[Mapping[str, Any]] = None,
    ) -> BatchMeta:
        """:meth:`fetch` as a coroutine: waits without blocking the event loop."""
        names = list(fields)
        encoded = None if sampler_args is None else _sampler_args.dumps(sampler_args)
        return await _aio.run(
            lambda done: self._native.get_meta(
                self.name, names, "fetch", batch_size, task, timeout, sampler, None, None, lease, encoded, done=done
            )
        )

    async def async_production_status(self, fields: Sequence[str]) -> Dict[str, Any]:
        """:meth:`production_status` as a coroutine."""
        names = list(fields)
        return await _aio.run(lambda done: self._native.production_status(self.name, names, done=done))

    async def async_consumption_status(self, task: str) -> Dict[str, Any]:
        """:meth:`consumption_status` as a coroutine."""
        return await _aio.run(lambda done: self._native.consumption_status(self.name, task, done=done))

    async def async_complete(self) -> None:
        """:meth:`complete` as a coroutine."""
        await _aio.run(lambda done: self._native.complete(self.name, done=done))

    async def async_clear(self) -> None:
        """:meth:`clear` as a coroutine."""
        await _aio.run(lambda done: self._native.clear_partition(self.name, done=done))

    # -- streams -----------------------------------------------------------------------------

    def stream(
        self,
        fields: Sequence[str],
        task: str,
        batch_size: int,
        *,
        sampler: Optional[str] = None,
        lease: Optional[float] = None,
        idle_timeout: Optional[float] = None,
    ) -> Iterator[Tuple[BatchMeta, Dict[str, Any]]]:
        """Yields ``(meta, data)`` for each batch of ``task`` as it becomes ready, until the
        partition is complete and the task has consumed all of it (the last batch may be
        smaller). Other streams of the same task share the samples: each goes to one of them.

        Without ``lease``, a batch is consumed when it is handed out. With ``lease``
        (seconds), it is acknowledged when the next one is asked for (so a ``for`` loop that
        runs to the end acknowledges every batch): a consumer that dies or stops while working
        on a batch lets it come back to the task after the lease, for another consumer. ``idle_timeout`` (seconds) raises
        :class:`tq.TimeoutError` after that long without a batch; by default a stream waits as
        long as the partition is not complete.
        """
        return _stream.stream(self, fields, task, batch_size, sampler=sampler, lease=lease, idle_timeout=idle_timeout)

    def async_stream(
        self,
        fields: Sequence[str],
        task: str,
        batch_size: int,
        *,
        sampler: Optional[str] = None,
        lease: Optional[float] = None,
        idle_timeout: Optional[float] = None,
    ) -> AsyncIterator[Tuple[BatchMeta, Dict[str, Any]]]:
        """:meth:`stream` as an async iterator (``async for meta, data in p.async_stream(...)``)."""
        return _stream.async_stream(self, fields, task, batch_size, sampler=sampler, lease=lease, idle_timeout=idle_timeout)

    def __repr__(self) -> str:
        return f"<tq.Partition {self.name!r}>"
