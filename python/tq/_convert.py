"""Python values to and from what the native module moves (see ``src/convert.rs``).

Dense fields are numpy arrays whose first dimension is the batch; they cross as one buffer
each way (copied once on the way in, viewed without a copy on the way out). A list of arrays is
a ragged field (one array per row). Any other list is an object field: ``str`` and ``bytes``
stay as they are, ``int``/``float``/``bool``/``None`` are written as text, and everything else
is pickled (see docs/python.md, "Object fields").
"""

from __future__ import annotations

import pickle
from typing import Any, Dict, List, Mapping, Sequence, Tuple

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


def columns_in(fields: Any) -> Dict[str, Tuple[str, Any, bool]]:
    if _torch.is_tensordict(fields):
        fields = _torch.tensordict_fields(fields)
    if not isinstance(fields, Mapping):
        raise TypeError(f"fields must be a mapping of field name to values, got {type(fields).__name__}")
    return {name: column_in(name, value) for name, value in fields.items()}


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
