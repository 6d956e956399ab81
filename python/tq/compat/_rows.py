"""Rows of TensorDicts whose columns may be dense tensors, nested (ragged) tensors or
non-tensor stacks: what splitting a put by partition, micro-batching a stream and joining
the reads of several partitions need. ``TensorDict`` indexing does not handle every such
column, so each column is taken apart by its kind here."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from tq import _torch as _tq_torch


def _column_rows(value: Any) -> List[Any]:
    """A column as one value per row."""
    import torch

    if isinstance(value, torch.Tensor):
        return list(value.unbind(0)) if value.is_nested else list(value)
    if hasattr(value, "tolist"):
        return list(value.tolist())
    return list(value)


def _column_of(rows: List[Any]) -> Any:
    """Rows back as one column: a dense tensor when every row is a tensor of one shape, a
    nested tensor when they are tensors of different shapes, else a list of objects."""
    import torch

    if rows and all(isinstance(r, torch.Tensor) for r in rows):
        if all(r.shape == rows[0].shape for r in rows):
            return torch.stack(rows)
        return _tq_torch.nested(rows)
    return rows


def _columns(data: Any) -> Dict[str, Any]:
    if hasattr(data, "batch_size"):
        return {k: data.get(k) for k in data.keys()}
    return dict(data)


def take_rows(data: Any, positions: Sequence[int]) -> Any:
    """Rows ``positions`` of ``data`` (a TensorDict or a dict of columns), as a TensorDict."""
    import torch

    out: Dict[str, Any] = {}
    for name, value in _columns(data).items():
        if isinstance(value, torch.Tensor) and not value.is_nested:
            out[name] = value[torch.tensor(list(positions), dtype=torch.long)]
        else:
            rows = _column_rows(value)
            out[name] = _column_of([rows[p] for p in positions]) if rows and isinstance(rows[0], torch.Tensor) else [rows[p] for p in positions]
    return _tq_torch.tensordict_out(out, len(positions))


def slice_rows(data: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of a TensorDict (dense columns as views)."""
    import torch

    out: Dict[str, Any] = {}
    for name, value in _columns(data).items():
        if isinstance(value, torch.Tensor) and not value.is_nested:
            out[name] = value[start:stop]
        else:
            rows = _column_rows(value)[start:stop]
            out[name] = _column_of(rows) if rows and isinstance(rows[0], torch.Tensor) else rows
    return _tq_torch.tensordict_out(out, stop - start)


def assemble(parts: List[Tuple[List[int], Dict[str, Any]]], rows: int) -> Any:
    """One TensorDict of ``rows`` rows from parts whose row ``j`` is row ``positions[j]``
    (columns as ``format="torch"`` reads answer them)."""
    names = list(parts[0][1]) if parts else []
    out: Dict[str, Any] = {}
    for name in names:
        merged: List[Any] = [None] * rows
        for positions, columns in parts:
            for j, value in enumerate(_column_rows(columns[name])):
                merged[positions[j]] = value
        out[name] = _column_of(merged)
    return _tq_torch.tensordict_out(out, rows)
