"""torch and TensorDict at the boundary (used only when the caller passes or asks for them;
importing tq never imports torch).

In: a CPU tensor crosses through ``Tensor.numpy()`` (a view, no copy), bf16 as its 16-bit
patterns; a tensor on another device is copied to the CPU first; a nested tensor is a ragged
field. A TensorDict's entries are fields, its non-tensor entries object fields.

Out (``format="torch"``): a dense field is ``torch.from_numpy`` of tq's buffer, no copy, when
that buffer belongs to this result alone. torch tensors are always writable, so a buffer tq
shares (a single key read where the store keeps it) is copied once instead of handing out a
view that writes would change under the store. bf16 fields come back as ``torch.bfloat16``.
Ragged fields are nested tensors (jagged layout where the rows differ in their first
dimension only). ``format="tensordict"`` wraps all of it in a TensorDict
with object fields as ``NonTensorStack``.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Dict, Mapping, Tuple

import numpy as np


def _torch() -> Any:
    try:
        import torch
    except ImportError:  # pragma: no cover - exercised only without torch
        raise ImportError("this needs torch (pip install torch)") from None
    return torch


def is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def is_tensordict(value: Any) -> bool:
    td = sys.modules.get("tensordict")
    return td is not None and isinstance(value, td.TensorDictBase)


def array_of(t: Any) -> Tuple[np.ndarray, bool]:
    """A tensor's values as a numpy array (a view when it is on the CPU and contiguous), and
    whether they are bf16 bit patterns."""
    torch = _torch()
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), True
    return t.numpy(), False


def tensor_in(field: str, t: Any) -> Tuple[str, Any, bool]:
    if t.is_nested:
        rows = [array_of(r) for r in t.unbind()]
        return ("ragged", [a for a, _ in rows], bool(rows) and rows[0][1])
    if t.dim() == 0:
        raise ValueError(f"field `{field}`: a dense field needs a batch dimension")
    array, bf16 = array_of(t)
    return ("dense", array, bf16)


def tensordict_fields(td: Any) -> Dict[str, Any]:
    """A TensorDict's entries as fields (non-tensor entries as lists of objects)."""
    out: Dict[str, Any] = {}
    for key in td.keys():
        value = td.get(key)
        out[key] = value if is_tensor(value) else value.tolist()
    return out


def _tensor_of(buffer: Any) -> Any:
    torch = _torch()
    # torch tensors are always writable: bytes tq shares (the store's own) are copied once.
    array = np.asarray(buffer if buffer.writable else buffer.writable_copy())
    t = torch.from_numpy(array)
    return t.view(torch.bfloat16) if buffer.dtype == "bf16" else t


def column_out(kind: str, payload: Any) -> Any:
    """One field for ``format="torch"``."""
    torch = _torch()
    if kind == "dense":
        return _tensor_of(payload)
    if kind == "ragged":
        rows = [_tensor_of(b) for b in payload]
        return nested(rows) if rows else rows
    return None  # objects: the caller decodes them


def nested(rows: Any) -> Any:
    """Tensors of different shapes as one nested tensor: the jagged layout where they differ
    in their first dimension only, else the strided one."""
    torch = _torch()
    try:
        return torch.nested.nested_tensor(rows, layout=torch.jagged)
    except (RuntimeError, ValueError):
        # The strided layout's "prototype" warning says nothing the caller chose.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.nested.nested_tensor(rows)


def tensordict_out(columns: Mapping[str, Any], rows: int) -> Any:
    from tensordict import NonTensorData, NonTensorStack, TensorDict

    entries: Dict[str, Any] = {}
    for name, value in columns.items():
        if isinstance(value, list):
            entries[name] = NonTensorStack(*(NonTensorData(v) for v in value))
        else:
            entries[name] = value
    return TensorDict(entries, batch_size=[rows])


def rows_of(columns: Mapping[str, Any]) -> int:
    for value in columns.values():
        return len(value) if isinstance(value, list) else int(value.shape[0])
    return 0

