"""TransferQueue's module API on tq: ``import tq.compat as transfer_queue``.

The functions keep the original's names, arguments, defaults and return types; data comes
back as a TensorDict, so torch and tensordict are needed (``pip install "./python[compat]"``).
Where tq deliberately behaves differently (a missing key is an error instead of a silently
shorter batch, for one) docs/python-compat.md says so and why.

Deployment (see ``_deploy``): under Ray, the first :func:`init` creates the named actor
``TransferQueueController`` (namespace ``transfer_queue``) running tq's native server, and
every other process of the cluster attaches to it by name; without Ray, the deployment runs
in the calling process and child processes attach through ``TQ_COMPAT_DEPLOYMENT``;
``backend.tq.connect`` attaches to a deployment started with the ``tq`` command. Only the
process that created a deployment stops it, in :func:`close`.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Union

from tq.errors import NotFoundError

from . import _config, _deploy, _kv
from ._calls import Call, both
from ._client import TransferQueueClient
from ._deploy import DEPLOYMENT_VARIABLE
from ._meta import BatchMeta, KVBatchMeta
from .dataloader import StreamingDataLoader, StreamingDataset
from .samplers import BaseSampler, GRPOGroupNSampler, RankAwareSampler, SeqlenBalancedSampler, SequentialSampler

__all__ = [
    "init",
    "close",
    "get_metrics_endpoint",
    "get_client",
    "kv_put",
    "kv_batch_put",
    "kv_batch_get",
    "kv_batch_get_by_meta",
    "kv_list",
    "kv_clear",
    "async_kv_put",
    "async_kv_batch_put",
    "async_kv_batch_get",
    "async_kv_batch_get_by_meta",
    "async_kv_list",
    "async_kv_clear",
    "save_checkpoint",
    "load_checkpoint",
    "BatchMeta",
    "KVBatchMeta",
    "TransferQueueClient",
    "StreamingDataset",
    "StreamingDataLoader",
    "StorageKeyNotFoundError",
    "BaseSampler",
    "SequentialSampler",
    "GRPOGroupNSampler",
    "RankAwareSampler",
    "SeqlenBalancedSampler",
]

#: What a read of keys a partition does not hold raises (tq's NotFoundError: the original
#: drops such keys from the result without a word; see docs/python-compat.md).
StorageKeyNotFoundError = NotFoundError

_lock = threading.Lock()
_deployment: Optional[_deploy.Deployment] = None


def init(conf: Any = None) -> Any:
    """Starts the deployment, or attaches to the one this process can find (a Ray actor, an
    address inherited from the parent process, ``backend.tq.connect``). Returns the
    configuration with where the deployment is (``backend.tq.connect``), as a plain dict;
    ``conf`` unchanged when attaching, as the original does. Calling it again in a process
    that is attached changes nothing."""
    global _deployment
    with _lock:
        if _deployment is not None and not _deployment.client.closed:
            return _deployment.conf if conf is None else conf
        plain = _config.plain(conf)
        # A configuration tq cannot honour is refused before anything starts or attaches.
        plan = _config.to_tq(plain)
        _deployment = _deploy.start(plain, plan)
        return _deployment.conf


def close() -> None:
    """Detaches this process. The process that created the deployment also stops it; one that
    only attached leaves it running for the others (unlike the original, which stops the
    controller from whichever process calls close)."""
    global _deployment
    with _lock:
        deployment, _deployment = _deployment, None
    if deployment is not None:
        deployment.close()


def get_metrics_endpoint() -> Optional[str]:
    """``host:port`` of the deployment's Prometheus endpoint (``GET /metrics``), started by
    ``init()`` when ``metrics.enabled`` is set; ``None`` when it is off or this process is not
    initialized. Its metric names are tq's (docs/operations.md), not the original's."""
    with _lock:
        deployment = _deployment
    if deployment is None:
        return None
    return (deployment.conf.get("metrics") or {}).get("endpoint")


def _attached() -> _deploy.Deployment:
    """This process's deployment, attaching to one it can find (the original attaches
    implicitly too)."""
    global _deployment
    with _lock:
        if _deployment is None or _deployment.client.closed:
            _deployment = _deploy.attach_existing()
        if _deployment is None:
            raise RuntimeError("TransferQueue is not initialized: call init() first")
        return _deployment


def get_client() -> TransferQueueClient:
    """A :class:`TransferQueueClient` over this process's connection."""
    deployment = _attached()
    return _deploy.compat_client(deployment.conf, deployment.client, f"TransferQueueClient_{os.getpid()}")


def _native() -> Any:
    return _attached().client._native


# -- KV ---------------------------------------------------------------------------------------


async def _kv_put(call: Call, key: str, partition_id: str, fields: Any = None, tag: Optional[Mapping[str, Any]] = None, data_parser: Any = None) -> KVBatchMeta:
    """Writes one key: ``fields`` maps field names to one row's value each (a tensor without
    the batch dimension, or any Python object) or is a one-row TensorDict; ``tag`` is merged
    into the key's tags."""
    return await _kv.kv_put(call, _native(), key, partition_id, fields, tag)


async def _kv_batch_put(
    call: Call,
    keys: Sequence[str],
    partition_id: str,
    fields: Any = None,
    tags: Optional[Sequence[Mapping[str, Any]]] = None,
    data_parser: Any = None,
) -> KVBatchMeta:
    """Writes row ``i`` of ``fields`` (a TensorDict or a dict of columns) and merges
    ``tags[i]`` into ``keys[i]``; everything is checked before anything is written."""
    return await _kv.kv_batch_put(call, _native(), keys, partition_id, fields, tags)


async def _kv_batch_get(call: Call, keys: Union[str, Sequence[str]], partition_id: str, select_fields: Union[None, str, Sequence[str]] = None) -> Any:
    """The fields of ``keys`` as a TensorDict, rows in the keys' order. A key the partition does
    not hold raises :class:`StorageKeyNotFoundError` (the original drops it silently)."""
    return await _kv.kv_batch_get(call, _native(), keys, partition_id, select_fields)


async def _kv_batch_get_by_meta(call: Call, meta: KVBatchMeta, select_fields: Union[None, str, Sequence[str]] = None) -> Any:
    """``kv_batch_get`` of the keys of ``meta`` (``select_fields`` among its fields)."""
    return await _kv.kv_batch_get_by_meta(call, _native(), meta, select_fields)


async def _kv_list(call: Call, partition_id: Optional[str] = None) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """``{partition_id: {key: tags}}`` for one partition (``{}`` when it does not exist) or all."""
    return await _kv.kv_list(call, _native(), partition_id)


async def _kv_clear(call: Call, keys: Union[str, Sequence[str]], partition_id: str) -> None:
    """Removes ``keys`` (missing ones are ignored) with their payloads and tags."""
    await _kv.kv_clear(call, _native(), keys, partition_id)


kv_put, async_kv_put = both(_kv_put)
kv_batch_put, async_kv_batch_put = both(_kv_batch_put)
kv_batch_get, async_kv_batch_get = both(_kv_batch_get)
kv_batch_get_by_meta, async_kv_batch_get_by_meta = both(_kv_batch_get_by_meta)
kv_list, async_kv_list = both(_kv_list)
kv_clear, async_kv_clear = both(_kv_clear)


# -- checkpoints ------------------------------------------------------------------------------

#: The original's metadata file, written next to tq's checkpoint files.
_METADATA_FILE = "metadata.json"


def save_checkpoint(checkpoint_dir: Union[str, "os.PathLike[str]"], *, include_storage: bool = True, metadata: Optional[Mapping[str, Any]] = None) -> None:
    """Saves the whole deployment (controller state and every storage unit's payloads) into
    ``checkpoint_dir`` (created if needed; the directory must be reachable from the
    controller's node), with ``metadata`` in ``metadata.json``. Storage is always saved:
    ``include_storage=False`` would lose the in-memory payloads, so it is ignored with a
    warning, as the original does for SimpleStorage. A failed save leaves the previous
    checkpoint loadable."""
    client = _attached().client
    if not include_storage:
        warnings.warn("save_checkpoint: include_storage=False is ignored: storage units are always saved", stacklevel=2)
    path = Path(checkpoint_dir)
    path.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"storage_saved": True, "user_metadata": dict(metadata or {})}, default=str)
    client.save_checkpoint(path)
    tmp = path / (_METADATA_FILE + ".tmp")
    tmp.write_text(body)
    os.replace(tmp, path / _METADATA_FILE)


def load_checkpoint(checkpoint_dir: Union[str, "os.PathLike[str]"]) -> Dict[str, Any]:
    """Restores a checkpoint into this deployment, which must hold nothing yet; everything is
    checked before anything changes. Returns the ``metadata`` given to the save."""
    client = _attached().client
    path = Path(checkpoint_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"load_checkpoint: no directory {path}")
    meta_file = path / _METADATA_FILE
    if not meta_file.is_file():
        raise FileNotFoundError(f"load_checkpoint: {meta_file} is missing")
    saved = json.loads(meta_file.read_text())
    client.load_checkpoint(path)
    return dict(saved.get("user_metadata") or {})
