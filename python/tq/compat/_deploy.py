"""Where a tq.compat deployment runs, and how other processes find it.

- **Under Ray** (``ray.is_initialized()``): the first :func:`start` creates the named actor
  ``TransferQueueController`` in namespace ``transfer_queue``, as the original does, which runs
  tq's controller and keeps the configuration (``get_config()``, with the controller's
  address and a fresh token), and one actor per storage unit (``TransferQueueStorageUnit#<i>``)
  placed on the alive nodes in turn (TransferQueue 0.1.11's layout), each running a tq
  storage unit that registers with the controller. The actors reserve no CPU by default
  (``backend.tq.unit_cpus``): a unit is a few native threads, mostly waiting on the network,
  and reserving a CPU each would leave a small cluster no room for its workers. Any process of
  the Ray cluster finds the controller by name and talks to it and to the units over tq's own
  protocol: payloads never travel through Ray's object store. Two processes racing to create
  it: the loser attaches.
- **Without Ray**: the deployment runs in the calling process (``tq.serve`` on loopback) and
  address (and whether fetches poll) goes into the environment variable
  ``TQ_COMPAT_DEPLOYMENT`` (JSON), which ``multiprocessing`` and ``subprocess`` children
  inherit; their ``init()`` attaches.
- ``backend.tq.connect`` (and ``backend.tq.token``) attaches to a deployment started with
  the ``tq`` command instead.

Only the process that created a deployment stops it.
"""

from __future__ import annotations

import copy
import json
import os
import secrets
import shutil
import sys
import tempfile
import threading
from typing import Any, Dict, List, Mapping, Optional, Tuple

import tq as _tq
from tq._native import render_metrics

from . import _config, _metrics
from ._client import DEFAULT_LEASE_SECONDS, TransferQueueClient

#: The environment variable through which child processes find an in-process deployment:
#: the part of its configuration an attaching process needs, as JSON.
DEPLOYMENT_VARIABLE = "TQ_COMPAT_DEPLOYMENT"
#: The Ray actor's name and namespace (the original's).
ACTOR_NAME = "TransferQueueController"
ACTOR_NAMESPACE = "transfer_queue"


class Deployment:
    """This process's attachment: the client, and what to stop on close if this process
    created the deployment."""

    def __init__(
        self, client: _tq.Client, conf: Dict[str, Any], server: Optional[_tq.Server] = None, actors: Optional["RayActors"] = None
    ) -> None:
        self.client = client
        self.conf = conf
        self.server = server
        self.actors = actors
        self._exported: Optional[str] = None
        #: The private directory of an in-process deployment's Unix socket (removed on close).
        self.socket_dir: Optional[str] = None
        #: The Prometheus endpoint this process serves for the deployment it created.
        self.metrics: Optional[_metrics.Endpoint] = None

    def export(self) -> None:
        """Puts where this deployment is into the environment, for child processes."""
        self._exported = json.dumps(attachment(self.conf))
        os.environ[DEPLOYMENT_VARIABLE] = self._exported

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
        self.client.close()
        if self.server is not None:
            self.server.close()
            if self._exported is not None and os.environ.get(DEPLOYMENT_VARIABLE) == self._exported:
                del os.environ[DEPLOYMENT_VARIABLE]
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
        if self.actors is not None:
            self.actors.stop()


def _ray_running() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def _with_address(conf: Dict[str, Any], url: str, token: Optional[str]) -> Dict[str, Any]:
    """``conf`` with where the deployment is (what attaching processes and datasets read)."""
    out = copy.deepcopy(conf)
    own = out.setdefault("backend", {}).setdefault("tq", {})
    own["connect"] = url
    if token:
        own["token"] = token
    return out


def attachment(conf: Mapping[str, Any]) -> Dict[str, Any]:
    """What a process needs of a deployment's configuration to attach to it and fetch as its
    creator does: where it is (``backend.tq.connect``, ``token``), whether fetches poll
    (``controller.polling_mode``), the sampler they name (``controller.tq_sampler``), how
    long they lease (``backend.tq.lease_seconds``) and how its clients reach the units
    (``backend.tq.net``). Plain JSON: it travels in the
    environment and in pickled datasets."""
    controller = conf.get("controller") or {}
    own = (conf.get("backend") or {}).get("tq") or {}
    endpoint = (conf.get("metrics") or {}).get("endpoint")
    return {
        **({"metrics": {"enabled": True, "endpoint": endpoint}} if endpoint else {}),
        "controller": {"polling_mode": bool(controller.get("polling_mode")), "tq_sampler": controller.get("tq_sampler")},
        "backend": {
            "tq": {
                "connect": own["connect"],
                "token": own.get("token"),
                "lease_seconds": own.get("lease_seconds", DEFAULT_LEASE_SECONDS),
                # How its clients reach the units (shared memory on the same node or not).
                "net": _config.client_net(own),
            }
        },
    }


def connect(conf: Mapping[str, Any]) -> _tq.Client:
    """A client of the deployment ``conf`` says where it is."""
    own = attachment(conf)["backend"]["tq"]
    return _tq.connect(own["connect"], token=own["token"], net=own["net"])


def compat_client(conf: Mapping[str, Any], client: _tq.Client, client_id: Optional[str] = None) -> TransferQueueClient:
    """A :class:`TransferQueueClient` over ``client`` that fetches as ``conf`` says."""
    a = attachment(conf)
    return TransferQueueClient(
        client,
        client_id,
        polling=a["controller"]["polling_mode"],
        sampler=a["controller"]["tq_sampler"],
        lease=a["backend"]["tq"]["lease_seconds"],
    )


def attach_existing() -> Optional[Deployment]:
    """An attachment to the deployment this process can find (Ray actor or inherited address),
    or ``None``."""
    if _ray_running():
        actor = _find_actor()
        if actor is not None:
            import ray

            conf = ray.get(actor.get_config.remote())
            return Deployment(connect(conf), conf)
    exported = os.environ.get(DEPLOYMENT_VARIABLE)
    if exported:
        conf = json.loads(exported)
        return Deployment(connect(conf), conf)
    return None


def start(conf: Dict[str, Any], plan: _config.Plan) -> Deployment:
    """Attaches where ``conf`` (``backend.tq.connect``) or this process tree says, else
    creates the deployment ``conf`` describes (``plan``: what it asks of tq)."""
    own = (conf.get("backend") or {}).get("tq") or {}
    if own.get("connect"):
        return Deployment(connect(conf), copy.deepcopy(conf))
    existing = attach_existing()
    if existing is not None:
        return existing
    conf = _with_sampler(conf, plan)
    if _ray_running():
        return _start_on_ray(conf, plan)
    # Same host only: a Unix socket is the cheapest way to the controller, and the directory
    # (mode 0700) keeps other users out.
    if plan.metrics_port is not None:
        _tq.install_metrics()  # before anything that records is built
    socket_dir = tempfile.mkdtemp(prefix="tq-compat-")
    try:
        server = _tq.serve(
            plan.sections,
            listen=f"unix://{socket_dir}/controller.sock",
            units=plan.units or None,
            default_sampler=plan.sampler_spec,
            samplers=_samplers(plan),
        )
        try:
            # This process calls its own deployment directly; other processes connect.
            client = server.local_client() if plan.units else server.connect()
        except BaseException:
            server.close()
            raise
    except BaseException:
        shutil.rmtree(socket_dir, ignore_errors=True)
        raise
    deployment = Deployment(client, _with_address(conf, server.url, None), server=server)
    deployment.socket_dir = socket_dir
    if plan.metrics_port is not None:
        try:
            own = (conf.get("backend") or {}).get("tq") or {}
            host = own.get("host") or os.environ.get(HOST_VARIABLE) or "127.0.0.1"
            deployment.metrics = _metrics.Endpoint(client.metrics_text, host, plan.metrics_port)
        except BaseException:
            deployment.close()
            raise
        deployment.conf = _with_metrics(deployment.conf, deployment.metrics.address, {})
    deployment.export()
    return deployment


def _with_metrics(conf: Dict[str, Any], endpoint: str, units: Dict[str, str]) -> Dict[str, Any]:
    """``conf`` with where its Prometheus endpoints are: ``metrics.endpoint`` (the
    controller's, what ``get_metrics_endpoint()`` returns) and, under Ray,
    ``metrics.storage_endpoints`` (each unit actor's, by actor name)."""
    out = copy.deepcopy(conf)
    metrics = out.setdefault("metrics", {})
    metrics["endpoint"] = endpoint
    if units:
        metrics["storage_endpoints"] = units
    return out


def _samplers(plan: _config.Plan) -> Optional[Dict[str, Any]]:
    return None if plan.python_sampler is None else {_config.PYTHON_SAMPLER: plan.python_sampler}


def _with_sampler(conf: Dict[str, Any], plan: _config.Plan) -> Dict[str, Any]:
    """``conf`` saying which sampler fetches name (``controller.tq_sampler``): the Python
    sampler's registered name when there is one (the controller's default otherwise)."""
    if plan.python_sampler is None:
        return conf
    out = dict(conf)
    out["controller"] = {**dict(conf.get("controller") or {}), "tq_sampler": _config.PYTHON_SAMPLER}
    return out


def _find_actor() -> Any:
    import ray

    try:
        return ray.get_actor(ACTOR_NAME, namespace=ACTOR_NAMESPACE)
    except ValueError:
        return None


class RayActors:
    """What a Ray deployment is made of: the controller actor and the unit actors.
    :meth:`stop` removes them all."""

    def __init__(self, controller: Any) -> None:
        self.controller = controller
        self.units: List[Any] = []

    def stop(self) -> None:
        import ray

        try:
            ray.get(self.controller.stop.remote())
        finally:
            for actor in [*self.units, self.controller]:
                ray.kill(actor)


def _round_robin(count: int) -> List[Any]:
    """Where unit ``i`` goes: the alive nodes in turn (what TransferQueue 0.1.11 does; unlike a
    SPREAD placement group, which is best-effort, every node gets ``count / nodes`` units,
    rounded)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
    if not nodes:
        raise RuntimeError("tq.compat: Ray reports no alive node to place the storage units on")
    return [NodeAffinitySchedulingStrategy(node_id=nodes[i % len(nodes)], soft=False) for i in range(count)]


def _start_on_ray(conf: Dict[str, Any], plan: _config.Plan) -> Deployment:
    import ray

    classes = _actor_classes()
    try:
        controller = classes.controller.options(name=ACTOR_NAME, namespace=ACTOR_NAMESPACE).remote()
    except ValueError:  # another process created it first
        found = attach_existing()
        if found is None:
            raise
        return found
    actors = RayActors(controller)
    try:
        token = secrets.token_hex(16)
        sections = copy.deepcopy(plan.sections)
        sections.setdefault("net", {})["token"] = token
        own = (conf.get("backend") or {}).get("tq") or {}
        host = own.get("host")
        units = plan.units
        metrics = plan.metrics_port
        url = ray.get(controller.start.remote(sections, units, plan.sampler_spec, _samplers(plan), host, metrics))
        if units:
            cpus = float(own.get("unit_cpus", 0))
            for i, strategy in enumerate(_round_robin(units)):
                actors.units.append(
                    classes.unit.options(
                        name=f"TransferQueueStorageUnit#{i}", namespace=ACTOR_NAMESPACE, num_cpus=cpus, scheduling_strategy=strategy
                    ).remote()
                )
            # Each answers once registered with the controller: then the deployment is whole.
            ray.get([u.start.remote(url, f"unit-{i}", sections, host, metrics is not None) for i, u in enumerate(actors.units)])
        full = _with_address(conf, url, token)
        if metrics is not None:
            endpoint = ray.get(controller.metrics_endpoint.remote())
            names = [f"TransferQueueStorageUnit#{i}" for i in range(len(actors.units))]
            found = ray.get([u.metrics_endpoint.remote() for u in actors.units])
            full = _with_metrics(full, endpoint, dict(zip(names, found)))
        ray.get(controller.store_config.remote(full))
        return Deployment(connect(full), full, actors=actors)
    except BaseException:
        actors.stop()
        raise


class _ActorClasses:
    def __init__(self, controller: Any, unit: Any) -> None:
        self.controller, self.unit = controller, unit


_ACTORS: Optional[_ActorClasses] = None


#: The host Ray actors serve on when ``backend.tq.host`` does not say (default: the node's
#: address as Ray knows it).
HOST_VARIABLE = "TQ_COMPAT_HOST"


def _host(host: Optional[str]) -> Tuple[str, bool]:
    """The host to serve on (``backend.tq.host``, ``TQ_COMPAT_HOST``, else this node's
    address) and whether it is loopback."""
    import ray

    host = host or os.environ.get(HOST_VARIABLE) or ray.util.get_node_ip_address()
    return host, host in ("127.0.0.1", "localhost", "::1")


def _actor_classes() -> _ActorClasses:
    """The Ray actors that host a deployment (made on first use: importing tq.compat never
    imports Ray)."""
    global _ACTORS
    if _ACTORS is None:
        import ray

        class TransferQueueController:
            """Runs tq's controller in this actor's process (its storage units are actors of
            their own) and keeps the configuration attaching processes read."""

            def __init__(self) -> None:
                self._server: Optional[_tq.Server] = None
                self._config: Optional[Dict[str, Any]] = None
                self._metrics: Optional[_metrics.Endpoint] = None
                self._client: Optional[_tq.Client] = None
                self._connecting = threading.Lock()

            def start(
                self,
                sections: Dict[str, Any],
                units: int,
                sampler: Optional[str],
                samplers: Optional[Dict[str, Any]],
                host: Optional[str],
                metrics_port: Optional[int] = None,
            ) -> str:
                host, loopback = _host(host)
                if metrics_port is not None:
                    _tq.install_metrics()
                self._server = _tq.serve(
                    sections,
                    listen=f"tcp://{host}:0",
                    units=units or None,
                    default_sampler=sampler,
                    samplers=samplers,
                    insecure=loopback,
                    remote_units=True,
                )
                if metrics_port is not None:
                    token = sections.get("net", {}).get("token")
                    self._metrics = _metrics.Endpoint(lambda: self._scrape(token), host, metrics_port)
                return self._server.url

            def _scrape(self, token: Optional[str]) -> str:
                """The controller's view: its request metrics and the deployment's state
                gauges (every unit's cells and bytes included). The client is made at the
                first scrape: connecting waits for the units, which start after this actor."""
                with self._connecting:  # scrapes may come in parallel
                    if self._client is None:
                        assert self._server is not None
                        self._client = self._server.connect(token=token)
                return self._client.metrics_text()

            def metrics_endpoint(self) -> Optional[str]:
                return None if self._metrics is None else self._metrics.address

            def store_config(self, conf: Dict[str, Any]) -> None:
                self._config = conf

            def get_config(self) -> Optional[Dict[str, Any]]:
                return self._config

            def stop(self) -> None:
                if self._metrics is not None:
                    self._metrics.close()
                if self._client is not None:
                    self._client.close()
                if self._server is not None:
                    self._server.close()

        class TransferQueueStorageUnit:
            """Runs one tq storage unit in this actor's process, registered with the
            controller."""

            def __init__(self) -> None:
                self._unit: Optional[_tq.UnitServer] = None
                self._metrics: Optional[_metrics.Endpoint] = None

            def start(self, controller: str, unit_id: str, sections: Dict[str, Any], host: Optional[str], metrics: bool = False) -> str:
                host, loopback = _host(host)
                if metrics:
                    _tq.install_metrics()
                self._unit = _tq.serve_unit(controller, unit_id, sections, listen=f"tcp://{host}:0", insecure=loopback)
                if metrics:
                    # This unit's request metrics (the controller's endpoint has its state).
                    self._metrics = _metrics.Endpoint(render_metrics, host, 0)
                return self._unit.endpoint

            def metrics_endpoint(self) -> Optional[str]:
                return None if self._metrics is None else self._metrics.address

            def node_id(self) -> str:
                """The Ray node this unit runs on."""
                return ray.get_runtime_context().get_node_id()

            def stop(self) -> None:
                if self._metrics is not None:
                    self._metrics.close()
                if self._unit is not None:
                    self._unit.close()

        _ACTORS = _ActorClasses(ray.remote(num_cpus=0)(TransferQueueController), ray.remote(TransferQueueStorageUnit))
    return _ACTORS
