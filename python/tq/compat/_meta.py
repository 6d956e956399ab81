"""TransferQueue's metadata objects, ``BatchMeta`` and ``KVBatchMeta``, over tq's.

A ``BatchMeta`` here has the original's attributes and methods (rows of global indexes and
partition ids, a field schema, production status, extra info, per-row custom meta), and
remembers, for each row, which of tq's native batch metadata it came from and at which
position. That is how ``get_data``, ``put`` and ``clear_samples`` reach tq with the sample ids
*and their generations*: a row of a ``BatchMeta`` built by hand has no such source, and
those calls refuse it (the original would read whatever sample now holds that index).
"""

from __future__ import annotations

import copy as _copy
import warnings
from types import MappingProxyType
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tq import BatchMeta as NativeMeta
from tq.errors import InvalidError

__all__ = ["BatchMeta", "KVBatchMeta"]

#: tq's dtype names and the torch dtype each one is (what the original's schema holds).
_TORCH_DTYPES = {
    "bool": "bool",
    "u8": "uint8",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "f16": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "f64": "float64",
}

#: Where a row came from: a native batch metadata, the row's position in it, and the task
#: that fetched it under a lease (``None`` when nothing awaits an acknowledgement).
Source = Optional[Tuple[NativeMeta, int, Optional[str]]]


def _torch_dtype(name: Optional[str]) -> Any:
    if name is None:
        return None
    import torch

    return getattr(torch, _TORCH_DTYPES[name])


def schema_of(native: NativeMeta) -> Dict[str, Dict[str, Any]]:
    """The original's field schema for a native batch metadata (dtypes as torch dtypes)."""
    out = {}
    for name, rec in native.schema.items():
        rec = dict(rec)
        rec["dtype"] = _torch_dtype(rec["dtype"])
        if rec["per_sample_shapes"] is None:
            del rec["per_sample_shapes"]
        else:
            rec["per_sample_shapes"] = [tuple(s) for s in rec["per_sample_shapes"]]
        out[name] = rec
    return out


def _chunk_sizes(total: int, n: int) -> List[int]:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"chunk: the number of chunks must be a positive int, got {n!r}")
    if n > total:
        warnings.warn(f"chunk: {n} chunks of {total} rows: some are empty", stacklevel=3)
    base, extra = divmod(total, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def _values_equal(a: Any, b: Any) -> bool:
    """Equality for extra_info values: same type, element-wise for tensors and arrays."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and bool(np.array_equal(a, b))
    if type(a).__module__ == "torch" and hasattr(a, "shape"):
        import torch

        return a.shape == b.shape and bool(torch.equal(a, b))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an object whose == does not answer a bool is unequal
        return False


def _merge_extra(infos: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """The union of several extra_info maps; a key in several must have equal values."""
    out: Dict[str, Any] = {}
    keys = [set(i) for i in infos]
    if keys and any(k != keys[0] for k in keys):
        warnings.warn("concat: the pieces' extra_info keys differ; keeping the union", stacklevel=3)
    for info in infos:
        for k, v in info.items():
            if k in out and not _values_equal(out[k], v):
                raise ValueError(f"concat: extra_info `{k}` differs between pieces ({out[k]!r} vs {v!r})")
            out.setdefault(k, v)
    return out


class _SampleView:
    """One row of a :class:`BatchMeta`, read-only."""

    __slots__ = ("_batch", "_i")

    def __init__(self, batch: "BatchMeta", i: int) -> None:
        self._batch, self._i = batch, i

    @property
    def global_index(self) -> int:
        return self._batch.global_indexes[self._i]

    @property
    def partition_id(self) -> str:
        return self._batch.partition_ids[self._i]

    @property
    def production_status(self) -> int:
        return int(self._batch.production_status[self._i])

    @property
    def custom_meta(self) -> "MappingProxyType[str, Any]":
        return MappingProxyType(self._batch.custom_meta[self._i])

    @property
    def fields(self) -> "MappingProxyType[str, MappingProxyType]":
        out = {}
        for name, rec in self._batch.field_schema.items():
            rec = dict(rec)
            shapes = rec.pop("per_sample_shapes", None)
            if shapes is not None:
                rec["shape"] = shapes[self._i]
            out[name] = MappingProxyType(rec)
        return MappingProxyType(out)

    def __repr__(self) -> str:
        return f"Sample(global_index={self.global_index}, partition_id={self.partition_id!r})"


class BatchMeta:
    """Columnar metadata of a batch of samples (TransferQueue's ``BatchMeta``).

    What ``get_meta`` and ``put`` answer, and what ``get_data``, ``put`` and
    ``clear_samples`` take. ``field_names`` are sorted; ``production_status`` is an int8
    array (1: every field of the batch is produced for that row).
    """

    __slots__ = (
        "global_indexes",
        "partition_ids",
        "field_schema",
        "production_status",
        "extra_info",
        "custom_meta",
        "_custom_backend_meta",
        "_sources",
    )

    def __init__(
        self,
        global_indexes: Sequence[int],
        partition_ids: Sequence[str],
        field_schema: Optional[Mapping[str, Mapping[str, Any]]] = None,
        production_status: Any = None,
        extra_info: Optional[Mapping[str, Any]] = None,
        custom_meta: Optional[Sequence[Mapping[str, Any]]] = None,
        _custom_backend_meta: Optional[Sequence[Mapping[str, Any]]] = None,
        _sources: Optional[Sequence[Source]] = None,
    ) -> None:
        self.global_indexes = [int(g) for g in global_indexes]
        self.partition_ids = list(partition_ids)
        size = len(self.global_indexes)
        if len(self.partition_ids) != size:
            raise ValueError(
                f"BatchMeta: {size} global_indexes but {len(self.partition_ids)} partition_ids"
            )
        self.field_schema = {k: dict(v) for k, v in (field_schema or {}).items()}
        for name, rec in self.field_schema.items():
            shapes = rec.get("per_sample_shapes")
            if shapes is not None and len(shapes) != size:
                raise ValueError(f"BatchMeta: field `{name}` has {len(shapes)} per_sample_shapes for {size} rows")
        if production_status is None:
            self.production_status = np.zeros(size, dtype=np.int8)
        else:
            self.production_status = np.array(production_status, dtype=np.int8, copy=True).reshape(-1)
            if len(self.production_status) != size:
                raise ValueError(
                    f"BatchMeta: {len(self.production_status)} production_status entries for {size} rows"
                )
        self.extra_info = dict(extra_info or {})
        self.custom_meta = self._per_row("custom_meta", custom_meta, size)
        self._custom_backend_meta = self._per_row("_custom_backend_meta", _custom_backend_meta, size)
        sources = list(_sources) if _sources is not None else [None] * size
        if len(sources) != size:
            raise ValueError(f"BatchMeta: {len(sources)} sources for {size} rows")
        self._sources: List[Source] = sources

    @staticmethod
    def _per_row(what: str, rows: Optional[Sequence[Mapping[str, Any]]], size: int) -> List[Dict[str, Any]]:
        if not rows:
            return [{} for _ in range(size)]
        if len(rows) != size:
            raise ValueError(f"BatchMeta: {what} has {len(rows)} entries for {size} rows")
        return [dict(r) for r in rows]

    # -- from tq ----------------------------------------------------------------------------

    @classmethod
    def from_native(cls, native: NativeMeta, extra_info: Optional[Mapping[str, Any]] = None, task: Optional[str] = None) -> "BatchMeta":
        """The rows of one native batch metadata (fetched by ``task``, under a lease when the
        native one has one)."""
        n = len(native)
        task = task if native.lease is not None else None
        return cls(
            native.global_indexes,
            [native.partition] * n,
            schema_of(native),
            [1 if p else 0 for p in native.production],
            extra_info,
            native.tags,
            None,
            [(native, i, task) for i in range(n)],
        )

    def native_groups(self, fields: Optional[Sequence[str]] = None) -> List[Tuple[NativeMeta, List[int]]]:
        """tq's batch metadata for these rows: per partition (in order of first appearance),
        one native metadata with ``fields`` (default: this batch's) and the positions of its
        rows here. Rows built by hand, with no tq source, are refused."""
        fields = self.field_names if fields is None else list(fields)
        by_partition: Dict[str, List[int]] = {}
        for i, pid in enumerate(self.partition_ids):
            if self._sources[i] is None:
                raise InvalidError(
                    f"BatchMeta: row {i} (global index {self.global_indexes[i]}, partition `{pid}`) "
                    "was not handed out by tq (a BatchMeta built by hand names indexes without "
                    "their generation): use one from get_meta, put or kv_retrieve_meta"
                )
            by_partition.setdefault(pid, []).append(i)
        out = []
        for pid, rows in by_partition.items():
            pieces: List[NativeMeta] = []
            run_src: Optional[NativeMeta] = None
            run: List[int] = []
            for i in rows:
                src, pos, _task = self._sources[i]  # type: ignore[misc]
                if src is not run_src and run:
                    pieces.append(_select(run_src, run, fields))
                    run = []
                run_src = src
                run.append(pos)
            if run:
                pieces.append(_select(run_src, run, fields))
            native = pieces[0] if len(pieces) == 1 else NativeMeta.concat(pieces)
            out.append((native.with_tags([self.custom_meta[i] for i in rows]), rows))
        return out

    def leased(self, positions: Optional[Sequence[int]] = None) -> List[Tuple[str, NativeMeta]]:
        """``(task, native metadata)`` of the rows (at ``positions``, default all) that a task
        fetched under a lease and that an acknowledgement consumes: one per hand-out."""
        rows = range(self.size) if positions is None else positions
        by_source: Dict[int, Tuple[NativeMeta, str, List[int]]] = {}
        for i in rows:
            source = self._sources[i]
            if source is None or source[2] is None:
                continue
            native, pos, task = source
            by_source.setdefault(id(native), (native, task, []))[2].append(pos)
        out = []
        for native, task, pos in by_source.values():
            rows_of = sorted(set(pos))
            whole = rows_of == list(range(len(native)))  # the common case: a whole fetch
            out.append((task, native if whole else native.select_samples(rows_of)))
        return out

    # -- attributes -------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """The number of rows."""
        return len(self.global_indexes)

    def __len__(self) -> int:
        return len(self.global_indexes)

    @property
    def field_names(self) -> List[str]:
        """The fields, sorted."""
        return sorted(self.field_schema)

    @property
    def is_ready(self) -> bool:
        """Whether there are rows and every one is produced."""
        return self.size > 0 and bool(np.all(self.production_status == 1))

    @property
    def samples(self) -> List[_SampleView]:
        """Read-only views of the rows."""
        return [_SampleView(self, i) for i in range(self.size)]

    def get_dtypes(self, field_name: str) -> List[Any]:
        """``field_name``'s dtype, once per row (``KeyError`` for an unknown field)."""
        if field_name not in self.field_schema:
            raise KeyError(f"field `{field_name}` is not in this BatchMeta")
        return [self.field_schema[field_name].get("dtype")] * self.size

    def get_shapes(self, field_name: str) -> List[Any]:
        """``field_name``'s per-row shapes (``KeyError`` for an unknown field)."""
        if field_name not in self.field_schema:
            raise KeyError(f"field `{field_name}` is not in this BatchMeta")
        rec = self.field_schema[field_name]
        shapes = rec.get("per_sample_shapes")
        return list(shapes) if shapes is not None else [rec.get("shape")] * self.size

    # -- extra info and custom meta ---------------------------------------------------------

    def get_extra_info(self, key: str, default: Any = None) -> Any:
        return self.extra_info.get(key, default)

    def set_extra_info(self, key: str, value: Any) -> None:
        self.extra_info[key] = value

    def get_all_extra_info(self) -> Dict[str, Any]:
        return _copy.deepcopy(self.extra_info)

    def update_extra_info(self, info_dict: Mapping[str, Any]) -> None:
        self.extra_info.update(info_dict)

    def remove_extra_info(self, key: str) -> Any:
        return self.extra_info.pop(key, None)

    def clear_extra_info(self) -> None:
        self.extra_info.clear()

    def has_extra_info(self, key: str) -> bool:
        return key in self.extra_info

    def get_all_custom_meta(self) -> List[Dict[str, Any]]:
        return _copy.deepcopy(self.custom_meta)

    def update_custom_meta(self, custom_meta: Optional[Sequence[Mapping[str, Any]]]) -> None:
        """Merges ``custom_meta[i]`` into row ``i``'s (``None``: nothing). Sent to tq by the
        client's ``set_custom_meta`` or the next ``put``."""
        if custom_meta is None:
            return
        if len(custom_meta) != self.size:
            raise ValueError(f"update_custom_meta: {len(custom_meta)} entries for {self.size} rows")
        for row, new in zip(self.custom_meta, custom_meta):
            row.update(new)

    def clear_custom_meta(self) -> None:
        self.custom_meta = [{} for _ in range(self.size)]

    # -- building new ones ------------------------------------------------------------------

    def _rows(self, positions: Sequence[int]) -> "BatchMeta":
        schema = {}
        for name, rec in self.field_schema.items():
            rec = dict(rec)
            if rec.get("per_sample_shapes") is not None:
                rec["per_sample_shapes"] = [rec["per_sample_shapes"][p] for p in positions]
            schema[name] = rec
        return BatchMeta(
            [self.global_indexes[p] for p in positions],
            [self.partition_ids[p] for p in positions],
            schema,
            self.production_status[list(positions)] if positions else [],
            dict(self.extra_info),
            [_copy.deepcopy(self.custom_meta[p]) for p in positions],
            [_copy.deepcopy(self._custom_backend_meta[p]) for p in positions],
            [self._sources[p] for p in positions],
        )

    def select_samples(self, sample_indices: Sequence[int]) -> "BatchMeta":
        """The rows at ``sample_indices``, in that order (duplicates allowed)."""
        positions = list(sample_indices)
        for p in positions:
            if not isinstance(p, (int, np.integer)) or not 0 <= p < self.size:
                raise ValueError(f"select_samples: position {p!r} is not in [0, {self.size})")
        return self._rows([int(p) for p in positions])

    def select_fields(self, field_names: Sequence[str]) -> "BatchMeta":
        """Only ``field_names`` (names this batch does not have are ignored); production
        status is kept as it is."""
        names = [field_names] if isinstance(field_names, str) else list(field_names)
        out = self.copy()
        out.field_schema = {k: v for k, v in out.field_schema.items() if k in names}
        out._custom_backend_meta = [
            {k: v for k, v in row.items() if k in names or k.startswith("_")} for row in out._custom_backend_meta
        ]
        return out

    def copy(self) -> "BatchMeta":
        """A deep copy (tq's sources are shared: they are immutable)."""
        out = self._rows(list(range(self.size)))
        out.extra_info = _copy.deepcopy(self.extra_info)
        out.field_schema = _copy.deepcopy(self.field_schema)
        return out

    def __getitem__(self, item: Any) -> "BatchMeta":
        if isinstance(item, bool) or not isinstance(item, (int, np.integer, slice)):
            raise TypeError(f"BatchMeta indices are ints or slices, not {type(item).__name__}")
        if isinstance(item, slice):
            return self._rows(list(range(self.size))[item])
        i = int(item)
        if i < 0:
            i += self.size
        if not 0 <= i < self.size:
            raise IndexError(f"BatchMeta index {item} out of range for {self.size} rows")
        return self._rows([i])

    def __iter__(self) -> Iterator[_SampleView]:
        return iter(self.samples)

    def chunk(self, chunks: int) -> List["BatchMeta"]:
        """``chunks`` consecutive pieces; the first ``size % chunks`` get one row more."""
        out, start = [], 0
        for n in _chunk_sizes(self.size, chunks):
            out.append(self._rows(list(range(start, start + n))))
            start += n
        return out

    def chunk_by_partition(self) -> List["BatchMeta"]:
        """One piece per partition, in order of first appearance."""
        groups: Dict[str, List[int]] = {}
        for i, pid in enumerate(self.partition_ids):
            groups.setdefault(pid, []).append(i)
        return [self._rows(rows) for rows in groups.values()]

    def union(self, other: Optional["BatchMeta"]) -> "BatchMeta":
        """The fields of both over the same rows (``other`` wins on a field both have;
        production is AND-ed; extra info and custom meta merge, ``other`` winning)."""
        if other is None or other.size == 0:
            return self.copy()
        if self.size == 0:
            return other.copy()
        if self.global_indexes != other.global_indexes:
            raise ValueError("union: global_indexes do not match")
        if self.partition_ids != other.partition_ids:
            raise ValueError("union: partition_ids do not match")
        out = self.copy()
        out.field_schema.update(_copy.deepcopy(other.field_schema))
        out.production_status = (self.production_status & other.production_status).astype(np.int8)
        out.extra_info.update(_copy.deepcopy(other.extra_info))
        for row, new in zip(out.custom_meta, other.custom_meta):
            row.update(_copy.deepcopy(new))
        for row, new in zip(out._custom_backend_meta, other._custom_backend_meta):
            row.update(_copy.deepcopy(new))
        out._sources = [_union_source(a, b) for a, b in zip(self._sources, other._sources)]
        return out

    @classmethod
    def concat(cls, data: Sequence["BatchMeta"], validate: bool = True) -> "BatchMeta":
        """The pieces' rows one after the other. With ``validate``, every piece must have the
        same fields with the same dtypes; shapes that differ make a field nested."""
        pieces = [d for d in data if d is not None and d.size > 0]
        if not pieces:
            if not data:
                warnings.warn("concat of no BatchMeta: an empty one", stacklevel=2)
            return cls.empty()
        first = pieces[0]
        if validate:
            for p in pieces[1:]:
                if p.field_names != first.field_names:
                    extra = sorted(set(p.field_names) - set(first.field_names))
                    missing = sorted(set(first.field_names) - set(p.field_names))
                    raise ValueError(f"concat: field names differ (extra {extra}, missing {missing})")
                for name in first.field_names:
                    a, b = first.field_schema[name].get("dtype"), p.field_schema[name].get("dtype")
                    if a != b:
                        raise ValueError(f"concat: dtype mismatch for field `{name}`: {a} vs {b}")
        schema: Dict[str, Dict[str, Any]] = {}
        for name, rec0 in first.field_schema.items():
            recs = [p.field_schema.get(name, rec0) for p in pieces]
            nested = any(r.get("is_nested") for r in recs) or len({r.get("shape") for r in recs}) > 1
            rec = dict(rec0)
            rec["is_nested"] = bool(nested)
            if nested or any(r.get("per_sample_shapes") is not None for r in recs):
                rec["per_sample_shapes"] = [
                    s for p, r in zip(pieces, recs) for s in (r.get("per_sample_shapes") or [r.get("shape")] * p.size)
                ]
                rec["shape"] = None
            schema[name] = rec
        return cls(
            [g for p in pieces for g in p.global_indexes],
            [pid for p in pieces for pid in p.partition_ids],
            schema,
            np.concatenate([p.production_status for p in pieces]),
            _merge_extra([p.extra_info for p in pieces]),
            [_copy.deepcopy(c) for p in pieces for c in p.custom_meta],
            [_copy.deepcopy(c) for p in pieces for c in p._custom_backend_meta],
            [s for p in pieces for s in p._sources],
        )

    def reorder(self, indices: Sequence[int]) -> None:
        """Reorders the rows in place: row ``i`` becomes the old row ``indices[i]``."""
        indices = list(indices)
        if len(indices) != self.size:
            raise ValueError(f"reorder: {len(indices)} indices for {self.size} rows")
        if len(set(indices)) != len(indices):
            raise ValueError("reorder: duplicated indices")
        if any(not 0 <= i < self.size for i in indices):
            raise ValueError(f"reorder: indices must be in [0, {self.size})")
        moved = self._rows(indices)
        for slot in self.__slots__:
            setattr(self, slot, getattr(moved, slot))

    def add_fields(self, tensor_dict: Any, set_all_ready: bool = True) -> "BatchMeta":
        """Adds the schema of the columns of ``tensor_dict`` (rows aligned with this batch);
        with ``set_all_ready``, marks every row produced. In place; returns ``self``."""
        names = list(tensor_dict.keys())
        if not names:
            warnings.warn("add_fields: nothing to add", stacklevel=2)
            return self
        rows = int(tensor_dict.batch_size[0]) if hasattr(tensor_dict, "batch_size") else len(tensor_dict[names[0]])
        if rows != self.size:
            raise ValueError(f"add_fields: {rows} rows for a BatchMeta of {self.size}")
        for name in names:
            self.field_schema[name] = _schema_of_column(tensor_dict[name])
        if set_all_ready:
            self.production_status = np.ones(self.size, dtype=np.int8)
        return self

    @classmethod
    def empty(cls, extra_info: Optional[Mapping[str, Any]] = None) -> "BatchMeta":
        """No rows, no fields."""
        return cls([], [], extra_info=extra_info)

    # -- pickling ---------------------------------------------------------------------------

    def __getstate__(self) -> Dict[str, Any]:
        return {slot: getattr(self, slot) for slot in self.__slots__}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        for slot in self.__slots__:
            setattr(self, slot, state[slot])
        # Unpickled arrays may be read-only; production status must stay writable.
        self.production_status = np.array(self.production_status, dtype=np.int8, copy=True)

    def __repr__(self) -> str:
        parts = sorted(set(self.partition_ids))
        return f"BatchMeta(size={self.size}, partitions={parts}, fields={self.field_names})"

    __str__ = __repr__


def _select(src: NativeMeta, positions: List[int], fields: Sequence[str]) -> NativeMeta:
    """``src``'s rows at ``positions`` with those of ``fields`` it has."""
    have = src.field_names
    keep = sorted(f for f in fields if f in have)
    native = src if keep == have else src.select_fields(keep)
    if positions != list(range(len(src))):
        native = native.select_samples(positions)
    return native


def _union_source(a: Source, b: Source) -> Source:
    """One row's tq source after a union: both sides' fields over the same sample."""
    if a is None or b is None:
        return a or b
    if a[0] is b[0]:
        return a
    merged = a[0].select_samples([a[1]]).union(b[0].select_samples([b[1]]))
    return (merged, 0, a[2] or b[2])


def _schema_of_column(column: Any) -> Dict[str, Any]:
    """The original's schema record of one column of a put (tensor, nested tensor or other)."""
    import torch

    if isinstance(column, torch.Tensor):
        if column.is_nested:
            shapes = [tuple(t.shape) for t in column.unbind()]
            return {
                "dtype": column.dtype,
                "shape": shapes[0] if shapes else None,
                "is_nested": True,
                "is_non_tensor": False,
                "per_sample_shapes": shapes,
            }
        shape = tuple(column.shape[1:]) or (1,)
        return {"dtype": column.dtype, "shape": shape, "is_nested": False, "is_non_tensor": False}
    return {"dtype": None, "shape": None, "is_nested": False, "is_non_tensor": True}


class KVBatchMeta:
    """What a KV write answers (TransferQueue's ``KVBatchMeta``): the keys, their tags
    (aligned with the keys), the partition and the fields the keys hold."""

    def __init__(
        self,
        keys: Sequence[str] = (),
        tags: Optional[Sequence[Mapping[str, Any]]] = None,
        partition_id: Optional[str] = None,
        fields: Optional[Sequence[str]] = None,
        extra_info: Optional[Mapping[str, Any]] = None,
    ) -> None:
        keys = list(keys)
        tags = [{} for _ in keys] if tags is None else [_copy.deepcopy(dict(t)) for t in tags]
        if len(tags) != len(keys):
            raise ValueError(f"KVBatchMeta: {len(keys)} keys but {len(tags)} tags")
        if len(set(keys)) != len(keys):
            raise ValueError("KVBatchMeta: duplicated keys")
        if fields is not None and len(set(fields)) != len(fields):
            raise ValueError("KVBatchMeta: duplicated fields")
        self.keys = keys
        self.tags = tags
        self.partition_id = partition_id
        self.fields = None if fields is None else list(fields)
        self.extra_info = _copy.deepcopy(dict(extra_info or {}))

    @classmethod
    def _owning(cls, keys: List[str], tags: List[Dict[str, Any]], partition_id: str, fields: List[str]) -> "KVBatchMeta":
        """A meta that takes over what a native call answered: fresh lists and dicts nobody
        else holds, keys already distinct, so there is nothing to copy or check (a put of 1024
        keys spent 1 ms deep-copying their tags)."""
        meta = cls.__new__(cls)
        meta.keys, meta.tags, meta.partition_id, meta.fields, meta.extra_info = keys, tags, partition_id, fields, {}
        return meta

    @property
    def size(self) -> int:
        """The number of keys."""
        return len(self.keys)

    def __len__(self) -> int:
        return len(self.keys)

    def _with(self, positions: Sequence[int]) -> "KVBatchMeta":
        return KVBatchMeta(
            [self.keys[p] for p in positions],
            [self.tags[p] for p in positions],
            self.partition_id,
            self.fields,
            self.extra_info,
        )

    def select_keys(self, keys_to_select: Sequence[str]) -> "KVBatchMeta":
        """The entries of ``keys_to_select``, in that order."""
        keys = list(keys_to_select)
        if len(set(keys)) != len(keys):
            raise ValueError("select_keys: duplicated keys")
        where = {k: i for i, k in enumerate(self.keys)}
        missing = [k for k in keys if k not in where]
        if missing:
            raise RuntimeError(f"select_keys: keys {missing} are not in this KVBatchMeta")
        return self._with([where[k] for k in keys])

    def reorder(self, indexes: Sequence[int]) -> None:
        """Reorders in place: entry ``i`` becomes the old entry ``indexes[i]``."""
        indexes = list(indexes)
        if len(indexes) != self.size:
            raise ValueError(f"reorder: {len(indexes)} indexes for {self.size} keys")
        if len(set(indexes)) != len(indexes):
            raise ValueError("reorder: duplicated indexes")
        moved = self._with(indexes)
        self.keys, self.tags = moved.keys, moved.tags

    def chunk(self, chunks: int) -> List["KVBatchMeta"]:
        """``chunks`` consecutive pieces, sized as :meth:`BatchMeta.chunk` sizes them."""
        out, start = [], 0
        for n in _chunk_sizes(self.size, chunks):
            out.append(self._with(range(start, start + n)))
            start += n
        return out

    @classmethod
    def concat(cls, data: Sequence["KVBatchMeta"]) -> "KVBatchMeta":
        """The pieces one after the other: one partition, one set of fields."""
        pieces = [d for d in data if d is not None and d.size > 0]
        if not pieces:
            return cls()
        first = pieces[0]
        for p in pieces[1:]:
            if p.partition_id != first.partition_id:
                raise ValueError(f"concat: partitions differ ({first.partition_id!r} vs {p.partition_id!r})")
            if p.fields is not None and set(p.fields) != set(first.fields or ()):
                raise ValueError(f"concat: fields differ ({first.fields} vs {p.fields})")
        extra = _merge_extra([p.extra_info for p in pieces])
        return cls(
            [k for p in pieces for k in p.keys],
            [t for p in pieces for t in p.tags],
            first.partition_id,
            first.fields,
            extra or None,
        )

    def __repr__(self) -> str:
        return f"KVBatchMeta(partition_id={self.partition_id!r}, keys={self.keys!r}, fields={self.fields!r})"

    __str__ = __repr__
