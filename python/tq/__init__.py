"""tq: a streaming sample store for reinforcement-learning post-training.

``tq.Client.embedded()`` runs a controller and storage units inside this process;
``tq.connect(url)`` attaches to a running deployment (``tq serve``). Both give a
:class:`Client`, whose :meth:`Client.partition` handles carry the KV API::

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
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from . import _convert
from ._native import Buffer, NativeClient
from .errors import *  # noqa: F401,F403 (the exception classes are part of the package API)
from .errors import TqError, __all__ as _error_names

__all__ = ["Client", "Partition", "Buffer", "connect", "__version__", *_error_names]

from ._native import __version__

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


class Client:
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

    def close(self) -> None:
        """Closes the client (and, when embedded, the store with it). Closing twice is fine."""
        self._native.close()

    @property
    def closed(self) -> bool:
        return self._native.closed

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<tq.Client {self._native!r} {state}>"


def connect(url: str, token: Optional[str] = None, config: ConfigLike = None, **sections: Any) -> Client:
    """A client of the deployment at ``url`` (``tcp://host:port``, as ``tq serve`` prints).

    ``token`` is the deployment's shared secret, if it has one (``TQ_NET_TOKEN`` works too).
    """
    form, text = _config_form(config, sections)
    return Client(NativeClient.connect(url, form, text, token))


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

    def kv_put(self, key: str, fields: Mapping[str, Any], tags: Optional[Mapping[str, Any]] = None) -> None:
        """Writes one key: ``fields`` maps field names to one row's value each."""
        rows = {name: _convert.row_in(name, value) for name, value in fields.items()}
        self.kv_batch_put([key], rows, None if tags is None else [tags])

    def kv_batch_put(
        self,
        keys: Sequence[str],
        fields: Mapping[str, Any],
        tags: Optional[Sequence[Mapping[str, Any]]] = None,
    ) -> None:
        """Writes several keys at once (created on first use): row ``i`` of every field and
        ``tags[i]`` belong to ``keys[i]``. Nothing changes if anything is refused."""
        keys = _convert.keys_in(keys)
        columns = _convert.columns_in(fields)
        self._native.kv_batch_put(self.name, keys, columns, None if tags is None else [dict(t) for t in tags])

    def kv_batch_get(self, keys: Sequence[str], fields: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """Reads keys; rows follow ``keys``' order. Without ``fields``, the fields every key
        holds. A dense field comes back as **one** read-only numpy array that views tq's
        buffer (no copy); copy it (``a.copy()``) to change it."""
        keys = _convert.keys_in(keys)
        names = None if fields is None else list(fields)
        return _convert.columns_out(self._native.kv_batch_get(self.name, keys, names))

    def kv_get(self, key: str, fields: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """Reads one key: field name → that key's value (a dense field's row, a ragged
        field's array, or the object)."""
        got = self.kv_batch_get([key], fields)
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

    def __repr__(self) -> str:
        return f"<tq.Partition {self.name!r}>"
