"""The original's KV functions (``kv_put``, ``kv_batch_get``, ...) over a tq client, each
written once for its blocking and ``async_`` forms (see ``_calls``)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from tq import _convert

from ._calls import Call
from ._meta import KVBatchMeta

Fields = Union[None, str, Sequence[str]]


def _fields(select_fields: Fields) -> Optional[List[str]]:
    return [select_fields] if isinstance(select_fields, str) else (None if select_fields is None else list(select_fields))


def _keys(keys: Union[str, Sequence[str]]) -> List[str]:
    keys = [keys] if isinstance(keys, str) else list(keys)
    if len(set(keys)) != len(keys):
        raise ValueError("duplicated keys")
    return keys


async def _partitions(call: Call, native: Any) -> List[str]:
    return list(await call(native.list_partitions))


async def write(
    call: Call, native: Any, partition: str, keys: List[str], fields: Any, tags: Optional[Sequence[Mapping[str, Any]]]
) -> KVBatchMeta:
    """Writes ``fields`` and merges ``tags`` into ``keys``; the meta of what they hold now."""
    if not isinstance(partition, str) or not partition:
        raise ValueError("partition_id must be a non-empty str")
    columns = None if fields is None else _convert.columns_in(fields, native.is_embedded)
    # One request: tq merges the tags into the keys' (as the original does) and answers what
    # the keys hold after the write (their tags in the order of ``keys``, a list this call
    # made: the meta takes it over).
    if columns is None:
        done = await call(native.kv_set_tags, partition, keys, [dict(t) for t in tags or []])
    else:
        done = await call(native.kv_batch_put, partition, keys, columns, None if tags is None else [dict(t) for t in tags])
    return KVBatchMeta._owning(keys, done["tags"], partition, done["fields"])


async def kv_batch_put(
    call: Call,
    native: Any,
    keys: Sequence[str],
    partition_id: str,
    fields: Any = None,
    tags: Optional[Sequence[Mapping[str, Any]]] = None,
) -> KVBatchMeta:
    if fields is None and tags is None:
        raise ValueError("kv_batch_put: give fields, tags or both")
    keys = _keys(keys)
    if tags is not None and len(tags) != len(keys):
        raise ValueError(f"kv_batch_put: {len(keys)} keys but {len(tags)} tags")
    if fields is not None and hasattr(fields, "batch_size") and int(fields.batch_size[0]) != len(keys):
        raise ValueError(f"kv_batch_put: {len(keys)} keys but {int(fields.batch_size[0])} rows")
    return await write(call, native, partition_id, keys, fields, tags)


async def kv_put(
    call: Call, native: Any, key: str, partition_id: str, fields: Any = None, tag: Optional[Mapping[str, Any]] = None
) -> KVBatchMeta:
    if fields is None and tag is None:
        raise ValueError("kv_put: give fields, a tag or both")
    if not isinstance(key, str):
        raise ValueError("kv_put: key must be a str")
    if fields is not None and getattr(fields, "is_nested", False):
        raise ValueError("kv_put: a nested tensor holds several rows: use kv_batch_put")
    if fields is not None and hasattr(fields, "batch_size"):
        if tuple(fields.batch_size)[:1] != (1,):
            raise ValueError(f"kv_put: a TensorDict of one row, got batch size {tuple(fields.batch_size)}")
        rows = fields
    else:
        rows = None if fields is None else {name: _convert.row_in(name, value) for name, value in fields.items()}
    return await write(call, native, partition_id, [key], rows, None if tag is None else [tag])


async def kv_batch_get(call: Call, native: Any, keys: Union[str, Sequence[str]], partition_id: str, select_fields: Fields = None) -> Any:
    keys = [keys] if isinstance(keys, str) else list(keys)
    got = await call(native.kv_batch_get, partition_id, keys, _fields(select_fields))
    return _convert.columns_out(got, "tensordict")


async def kv_batch_get_by_meta(call: Call, native: Any, meta: KVBatchMeta, select_fields: Fields = None) -> Any:
    if meta.partition_id is None:
        raise ValueError("kv_batch_get_by_meta: the meta has no partition_id")
    fields = _fields(select_fields)
    if fields is not None and (meta.fields is None or not set(fields) <= set(meta.fields)):
        raise ValueError(f"kv_batch_get_by_meta: {fields} are not all among the meta's fields {meta.fields}")
    chosen = fields if fields is not None else (meta.fields or None)
    return await kv_batch_get(call, native, meta.keys, meta.partition_id, chosen)


async def kv_list(call: Call, native: Any, partition_id: Optional[str] = None) -> Dict[str, Dict[str, Dict[str, Any]]]:
    present = await _partitions(call, native)
    names = present if partition_id is None else [n for n in present if n == partition_id]
    return {name: dict(await call(native.kv_list, name)) for name in names}


async def kv_clear(call: Call, native: Any, keys: Union[str, Sequence[str]], partition_id: str) -> None:
    keys = [keys] if isinstance(keys, str) else list(keys)
    if not keys:
        raise ValueError("kv_clear: no keys given")
    await call(native.kv_clear, partition_id, keys)  # a missing partition or key: nothing to do
