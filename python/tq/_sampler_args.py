"""Per-call inputs for a sampler written in Python (``sampler_args`` of a fetch; tq.compat's
``sampling_config`` entries beyond ``dp_rank`` and ``batch_index``), as they travel to the
controller: opaque bytes in the fetch request, decoded in the process hosting the controller
just before the sampler is called.

The encoding is pickle, restricted on the way back in: a controller decodes only plain values
(``None``, bools, numbers, strings, bytes, lists, tuples, dicts, sets) and numpy arrays and
scalars. Anything else is refused by name instead of being imported and run, so a fetch request
cannot make the controller execute code. torch tensors are sent as numpy arrays (the sampler
receives an ``ndarray``), since unpickling a tensor means running torch's rebuild functions.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, Dict, Mapping

from .errors import InvalidError

#: The globals a controller's decoder resolves: numpy's array and scalar reconstruction (both
#: module names numpy has used; numpy 2 rebuilds arrays from their bytes), dtypes, and the builtins pickle names for some plain values.
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("builtins", "complex"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "bytearray"),
}


def _plain(value: Any) -> Any:
    """``value`` with torch tensors (at any depth of lists, tuples and dicts) as numpy arrays."""
    if type(value).__module__.startswith("torch") and hasattr(value, "numpy"):
        return value.detach().cpu().numpy()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def dumps(args: Mapping[str, Any]) -> bytes:
    """The bytes a fetch carries for ``args`` (names → values)."""
    if not all(isinstance(k, str) for k in args):
        raise InvalidError("sampler_args: the names must be str")
    try:
        return pickle.dumps({k: _plain(v) for k, v in args.items()}, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise InvalidError(f"sampler_args: cannot encode them: {e}") from e


class _Restricted(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"sampler_args may hold plain values and numpy arrays only, not {module}.{name}"
        )


def loads(data: bytes) -> Dict[str, Any]:
    """What :func:`dumps` encoded; refuses anything but plain values and numpy arrays."""
    value = _Restricted(io.BytesIO(data)).load()
    if not isinstance(value, dict):
        raise pickle.UnpicklingError("sampler_args must decode to a dict of names")
    return value
