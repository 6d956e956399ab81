"""TransferQueue's configuration keys, mapped onto tq's configuration.

The original reads a nested config (an OmegaConf ``DictConfig`` or a dict) with the sections
``controller``, ``backend`` and ``metrics``; :func:`to_tq` turns one into the sections of a
tq configuration (``controller``, ``storage``, ``net``) plus how many storage units to start.
A key tq cannot honour is refused with an error that says so, never dropped silently.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple

from ..errors import InvalidError, UnsupportedError

# The original's sampler class names and the tq sampler each one is.
SAMPLERS = {
    "SequentialSampler": "sequential",
    "GRPOGroupNSampler": "grpo",
    "RankAwareSampler": "rank-aware",
    "SeqlenBalancedSampler": "seqlen-balanced",
}

# Backends of the original that tq does not have, and what to use instead.
_NEAREST = {
    "mooncakestore": "Redis Cluster (`backend.tq` with a `redis+cluster://` store) or object "
    "storage (`s3://`, `file://`) for payloads shared across nodes",
    "yuanrong": "Redis Cluster (`backend.tq` with a `redis+cluster://` store) for payloads "
    "with expiry, or SimpleStorage",
    "raystore": "SimpleStorage (tq never moves payloads through Ray's object store)",
}


def plain(conf: Any) -> Dict[str, Any]:
    """A nested dict from a dict or an OmegaConf config (``None``: empty)."""
    if conf is None:
        return {}
    if isinstance(conf, Mapping):
        return {k: plain(v) if isinstance(v, Mapping) or _is_omegaconf(v) else v for k, v in conf.items()}
    if _is_omegaconf(conf):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(conf, resolve=True)  # type: ignore[no-any-return]
    raise InvalidError(f"init(conf): expected a dict or an OmegaConf config, got {type(conf).__name__}")


def _is_omegaconf(value: Any) -> bool:
    return type(value).__module__.startswith("omegaconf")


#: Keys of ``backend.tq`` that are tq.compat's own (the rest are tq configuration sections):
#: where a running deployment is (``connect``, ``token``), what Ray actors serve on
#: (``host``) and reserve (``unit_cpus``), and how long a fetched batch stays leased
#: (``lease_seconds``; ``None``: consumed when fetched).
COMPAT_KEYS = ("connect", "token", "host", "unit_cpus", "lease_seconds")

#: The name a sampler written in Python is registered under with the controller.
PYTHON_SAMPLER = "tq.compat:python"


def client_net(own: Mapping[str, Any]) -> Dict[str, Any]:
    """The ``net`` section of tq.compat's clients, from ``backend.tq`` (``own``).

    Shared memory is on by default (on Linux): a client and the storage units on its node move
    payloads of 256 KiB and more through sealed shared-memory segments, and units on other
    nodes are reached over TCP as before. tq's own API leaves it off; here it is on because the
    original's users run exactly that layout under Ray, where 1 MiB samples moved 1.8x faster
    with it (docs/python-compat.md). ``backend.tq.net.shared_memory: false`` or
    ``TQ_NET_SHARED_MEMORY=false`` turns it off."""
    net = dict(own.get("net") or {})
    if sys.platform.startswith("linux"):
        net.setdefault("shared_memory", True)
    return net


class Plan(NamedTuple):
    """What the original's configuration asks of tq."""

    #: tq configuration sections (``controller``, ``storage``, ``net``, ...).
    sections: Dict[str, Any]
    #: Storage units to start (0: shared KV storage, no units).
    units: int
    #: tq's sampler specification for the controller's default (a built-in sampler).
    sampler_spec: Optional[str]
    #: A sampler written in Python, which the controller calls back (fetches name it).
    python_sampler: Any
    #: The port of the Prometheus endpoint (``metrics.port``; 0: a free one), or ``None``
    #: when ``metrics.enabled`` is off.
    metrics_port: Optional[int] = None


def sampler_of(sampler: Any) -> Tuple[Optional[str], Any]:
    """``(tq sampler spec, Python sampler)`` for the original's ``controller.sampler`` (a
    class name, a sampler class or a sampler instance): one of them is set."""
    from . import samplers

    if isinstance(sampler, str):
        if sampler in SAMPLERS:
            return getattr(samplers, sampler)().spec(), None
        raise InvalidError(
            f"Could not find sampler `{sampler}` (tq.compat has {', '.join(sorted(SAMPLERS))})"
        )
    if isinstance(sampler, type) and issubclass(sampler, samplers.BaseSampler):
        sampler = sampler()
    if isinstance(sampler, samplers.BaseSampler):
        spec = sampler.spec()
        return (spec, None) if spec is not None else (None, sampler)
    raise InvalidError(f"controller.sampler: expected a sampler name, class or instance, got {sampler!r}")


def to_tq(conf: Mapping[str, Any]) -> Plan:
    """What tq runs for the original's ``conf``; ``backend.tq`` (a tq configuration as a
    dict) is merged over the result."""
    controller = dict(conf.get("controller") or {})
    backend = dict(conf.get("backend") or {})
    metrics = dict(conf.get("metrics") or {})
    tq_sections: Dict[str, Any] = {"controller": {}, "storage": {}, "net": client_net({})}

    spec, python_sampler = sampler_of(controller.get("sampler") or "SequentialSampler")
    if controller.get("polling_mode"):
        # Polling: a fetch answers at once, possibly empty, instead of waiting.
        tq_sections["controller"]["fetch_timeout_ms"] = 0

    name = str(backend.get("storage_backend") or "SimpleStorage")
    units = 0
    if name.lower() == "simplestorage":
        simple = dict(backend.get("SimpleStorage") or {})
        units = int(simple.get("num_data_storage_units") or 2)
        if units < 1:
            raise InvalidError("backend.SimpleStorage.num_data_storage_units must be at least 1")
        total = simple.get("total_storage_size")
        if total is not None:
            # The total itself, held by the controller: per-unit shares would refuse puts
            # before it is reached, since a batch's rows lie on units in runs of 16.
            total = int(total)
            if total < 1:
                raise InvalidError("backend.SimpleStorage.total_storage_size must be at least 1")
            tq_sections["controller"]["max_samples"] = total
        ssd = ssd_offload(simple.get("ssd_offload"))
        if ssd is not None:
            tq_sections["storage"]["ssd"] = ssd
    elif name.lower() in _NEAREST:
        raise UnsupportedError(
            f"backend.storage_backend `{name}`: tq has no such backend; the nearest is "
            f"{_NEAREST[name.lower()]}"
        )
    elif name.lower() != "tq":
        raise InvalidError(f"backend.storage_backend `{name}` is not a TransferQueue backend")

    metrics_port = None
    if metrics.get("enabled"):
        metrics_port = int(metrics.get("port") or 0)
        if not 0 <= metrics_port < 65536:
            raise InvalidError(f"metrics.port: {metrics_port} is not a TCP port")

    own = dict(backend.get("tq") or {})
    for key in COMPAT_KEYS:  # tq.compat's own settings, not tq configuration sections
        own.pop(key, None)
    for section, values in own.items():
        if not isinstance(values, Mapping):
            raise InvalidError(f"backend.tq.{section}: expected a section (a dict)")
        tq_sections.setdefault(section, {}).update(values)
    if tq_sections["storage"].get("backend") == "kv":
        units = 0  # shared storage: no units, clients reach the store directly
        tq_sections["storage"].pop("capacity_per_unit", None)
    elif name.lower() == "tq":
        units = int(tq_sections["storage"].get("num_units", 2))
    return Plan(tq_sections, units, spec, python_sampler, metrics_port)


#: The keys of ``backend.SimpleStorage.ssd_offload`` (TransferQueue PR #162).
_SSD_OFFLOAD_KEYS = ("enabled", "path")


def ssd_offload(offload: Any) -> Optional[Dict[str, Any]]:
    """tq's ``[storage.ssd]`` for the original's ``backend.SimpleStorage.ssd_offload``
    (``enabled``, ``path``), or ``None`` when it is off. Both move the cells of at least 1 MiB
    to files below ``path`` on each unit's node and keep the smaller ones in memory; tq creates
    ``path`` with its parents like the original, and keeps each run's files in a directory of
    its own below it."""
    offload = dict(offload or {})
    unknown = sorted(set(offload) - set(_SSD_OFFLOAD_KEYS))
    if unknown:
        raise InvalidError(
            f"backend.SimpleStorage.ssd_offload: unknown keys {', '.join(unknown)} "
            f"(it takes {', '.join(_SSD_OFFLOAD_KEYS)}; tq's own, such as threshold_bytes, "
            "go in backend.tq.storage.ssd)"
        )
    if not offload.get("enabled"):
        return None
    path = offload.get("path")
    if not path:
        raise InvalidError("backend.SimpleStorage.ssd_offload.path is required when enabled is true")
    return {"enabled": True, "path": str(path)}
