"""Python values to and from what the native module moves (see ``src/convert.rs``).

Dense fields are numpy arrays whose first dimension is the batch; they cross as one buffer
each way (copied once on the way in, viewed without a copy on the way out). A list of arrays is
a ragged field (one array per row). Any other list is an object field: ``str`` and ``bytes``
stay as they are, ``int``/``float``/``bool``/``None`` are written as text, and everything else
is pickled (see docs/python.md, "Object fields").
"""

from __future__ import annotations

import pickle
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import _torch

# One tag byte in front of each encoded object says how to read it back.
_STR, _BYTES, _INT, _FLOAT, _BOOL, _NONE, _PICKLE = b"s", b"b", b"i", b"f", b"?", b"n", b"p"


def encode_object(value: Any) -> bytes:
    """One Python object as the bytes of an object cell."""
    if isinstance(value, str):
        return _STR + value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _BYTES + bytes(value)
    if isinstance(value, bool):  # before int: bool is an int
        return _BOOL + (b"1" if value else b"0")
    if isinstance(value, int):
        return _INT + str(value).encode()
    if isinstance(value, float):
        return _FLOAT + repr(value).encode()
    if value is None:
        return _NONE
    return _PICKLE + pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def decode_object(data: bytes) -> Any:
    """The Python object an object cell holds (bytes another client wrote raw come back as
    ``bytes``)."""
    tag, body = data[:1], data[1:]
    if tag == _STR:
        return body.decode("utf-8")
    if tag == _BYTES:
        return body
    if tag == _BOOL:
        return body == b"1"
    if tag == _INT:
        return int(body)
    if tag == _FLOAT:
        return float(body)
    if tag == _NONE and not body:
        return None
    if tag == _PICKLE:
        return pickle.loads(body)
    return bytes(data)


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray)


def column_in(field: str, value: Any) -> Tuple[str, Any, bool]:
    """A field's value for the native module: ``(kind, payload, bf16)``."""
    if _torch.is_tensor(value):
        return _torch.tensor_in(field, value)
    if _is_array(value) and value.dtype != object:
        if value.ndim == 0:
            raise ValueError(f"field `{field}`: a dense field needs a batch dimension")
        return ("dense", np.ascontiguousarray(value), False)
    if isinstance(value, (list, tuple)):
        items = list(value)
        if items and all(_is_array(v) and v.dtype != object for v in items):
            return ("ragged", [np.ascontiguousarray(v) for v in items], False)
        if items and all(_torch.is_tensor(v) for v in items):
            rows = [_torch.array_of(v) for v in items]
            return ("ragged", [a for a, _ in rows], rows[0][1])
        return ("objects", [encode_object(v) for v in items], False)
    if _is_array(value):  # an object array: one Python object per row
        return ("objects", [encode_object(v) for v in value.tolist()], False)
    raise TypeError(
        f"field `{field}`: expected a numpy array (dense), a list of arrays (ragged) or a list "
        f"of objects, got {type(value).__name__}"
    )


def row_in(field: str, value: Any) -> Any:
    """One row's value as a one-row column (for ``kv_put``)."""
    if _is_array(value) and value.dtype != object:
        return value[np.newaxis, ...]
    if _torch.is_tensor(value):
        return value.unsqueeze(0)
    if isinstance(value, (int, float, bool, np.number)) and not isinstance(value, (str, bytes)):
        return np.asarray([value])
    return [value]


def _freeze(array: np.ndarray) -> None:
    """Makes an array handed over to the store read-only, and the arrays it views (a row
    ``kv_put`` was given is viewed with a batch dimension added): writes through them would
    change stored data. Views made earlier by the caller keep their flags."""
    while isinstance(array, np.ndarray):
        array.flags.writeable = False
        array = array.base


def columns_in(fields: Any, embedded: bool, copy: Optional[bool] = None) -> Dict[str, Tuple[str, Any, bool, bool]]:
    """The fields of a write for the native module: ``(kind, payload, bf16, take)`` each.

    ``take`` says the arrays may be used where they are instead of copied into tq's buffer.
    ``copy=None`` lets tq choose: a connected client takes them (the bytes only travel during
    the call), an embedded one copies (its storage keeps the bytes). ``copy=False`` hands the
    arrays over even to an embedded store, which then holds them; numpy arrays handed over
    that way are made read-only so that a later write fails instead of changing stored data.
    """
    if _torch.is_tensordict(fields):
        fields = _torch.tensordict_fields(fields)
    if not isinstance(fields, Mapping):
        raise TypeError(f"fields must be a mapping of field name to values, got {type(fields).__name__}")
    take = (not embedded) if copy is None else not copy
    held = take and embedded
    columns = {}
    for name, value in fields.items():
        kind, payload, bf16 = column_in(name, value)
        if held and kind != "objects":
            for array in [payload] if kind == "dense" else payload:
                _freeze(array)
        columns[name] = (kind, payload, bf16, take)
    return columns


FORMATS = ("numpy", "torch", "tensordict")


def column_out(kind: str, payload: Any, format: str = "numpy") -> Any:
    if kind == "objects":
        return [decode_object(b) for b in payload]
    if format != "numpy":
        return _torch.column_out(kind, payload)
    if kind == "dense":
        return np.asarray(payload)
    return [np.asarray(b) for b in payload]


def columns_out(native: Mapping[str, Tuple[str, Any]], format: str = "numpy") -> Any:
    """The fields of a read as ``format`` asks: numpy arrays, torch tensors, or one
    TensorDict."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {format!r}")
    columns = {name: column_out(kind, payload, format) for name, (kind, payload) in native.items()}
    if format == "tensordict":
        return _torch.tensordict_out(columns, _torch.rows_of(columns))
    return columns


def keys_in(keys: Sequence[str]) -> List[str]:
    if isinstance(keys, str):
        raise TypeError("keys must be a list of str, not one str (use kv_put for one key)")
    return list(keys)
