"""tq.compat under Ray: the first init() places the controller in the named actor and the
storage units on the nodes in turn, other processes of the cluster (Ray tasks and actors)
attach by name, a consumer that dies holding fetched samples gives them back, and only the
creator's close() stops the deployment. A real Ray cluster of two nodes on this machine
(``ray.cluster_utils.Cluster``: two raylets), torn down at the end."""

from __future__ import annotations

import os
from typing import Iterator

import pytest

if os.environ.get("TQ_REQUIRE_TORCH"):
    import tensordict
    import torch
else:
    torch = pytest.importorskip("torch")
    tensordict = pytest.importorskip("tensordict")
if os.environ.get("TQ_REQUIRE_RAY"):
    import ray
else:
    ray = pytest.importorskip("ray")

import tq
import tq.compat as transfer_queue

# Loopback only: the actor serves on the address its node is reached at otherwise.
CONF = {"backend": {"tq": {"host": "127.0.0.1"}, "SimpleStorage": {"num_data_storage_units": 2}}}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[object]:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, namespace="tq-tests", log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def _controller_actor():
    return ray.get_actor(transfer_queue._deploy.ACTOR_NAME, namespace=transfer_queue._deploy.ACTOR_NAMESPACE)


@ray.remote(num_cpus=0)
def _rollout(i: int) -> list:
    import torch

    import tq.compat as transfer_queue

    transfer_queue.init()  # attaches to the driver's deployment by name
    meta = transfer_queue.kv_put(f"k{i}", "train", fields={"x": torch.full((3,), float(i))}, tag={"worker": i})
    transfer_queue.close()
    return meta.keys


@ray.remote(num_cpus=0)
class _Trainer:
    def __init__(self) -> None:
        import tq.compat as transfer_queue

        self.tq = transfer_queue
        self.tq.init()

    def read(self, keys: list) -> list:
        return self.tq.kv_batch_get(keys, "train")["x"][:, 0].tolist()

    def close(self) -> None:
        self.tq.close()


def test_workers_attach_by_name_and_only_the_creator_stops_it(ray_cluster) -> None:
    conf = transfer_queue.init(CONF)
    try:
        actor = _controller_actor()
        stored = ray.get(actor.get_config.remote())  # as the original's tutorial reads it
        assert stored["backend"]["tq"]["connect"] == conf["backend"]["tq"]["connect"]
        assert stored["backend"]["tq"]["token"]  # a token: the actor may serve beyond loopback
        units = [ray.get_actor(f"TransferQueueStorageUnit#{i}", namespace="transfer_queue") for i in range(2)]
        nodes = ray.get([u.node_id.remote() for u in units])
        assert len(set(nodes)) == 2  # one unit on each node
        status = transfer_queue.get_client()._client.status()
        assert sorted(u["id"] for u in status["units"]) == ["unit-0", "unit-1"]
        assert ray.get([_rollout.remote(i) for i in range(3)]) == [["k0"], ["k1"], ["k2"]]
        trainer = _Trainer.remote()
        assert ray.get(trainer.read.remote(["k2", "k0"])) == [2.0, 0.0]
        ray.get(trainer.close.remote())  # an attached process's close leaves the deployment
        assert transfer_queue.kv_batch_get(["k1"], "train")["x"].tolist() == [[1.0] * 3]
        assert transfer_queue.kv_list("train")["train"]["k2"] == {"worker": 2}
    finally:
        transfer_queue.close()
    with pytest.raises(ValueError):
        _controller_actor()
    with pytest.raises(ValueError):
        ray.get_actor("TransferQueueStorageUnit#0", namespace="transfer_queue")
    assert ray.available_resources().get("CPU") == 4  # the units reserved none


def _scrape(endpoint: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as answer:
        return answer.read().decode()


def test_metrics_enabled_serves_from_the_controller_and_each_unit_actor(ray_cluster) -> None:
    conf = transfer_queue.init({**CONF, "metrics": {"enabled": True}})
    try:
        endpoint = transfer_queue.get_metrics_endpoint()
        assert endpoint and endpoint == conf["metrics"]["endpoint"]
        units = conf["metrics"]["storage_endpoints"]
        assert sorted(units) == ["TransferQueueStorageUnit#0", "TransferQueueStorageUnit#1"]
        assert ray.get(_rollout.remote(7)) == ["k7"]
        # An attached process (the rollout task) reads the same endpoint from the actor.
        assert ray.get(_endpoint.remote()) == endpoint
        text = _scrape(endpoint)
        assert 'tq_partition_samples_total{partition_id="train"} 1' in text
        assert 'tq_controller_request_total{op_type="KV_PREPARE_PUT"} 1' in text
        # The unit that holds the sample counted the put in its own process.
        puts = [_scrape(u) for u in units.values()]
        assert sum('tq_storage_request_total{op_type="PUT_DATA"} 1' in t for t in puts) == 1
    finally:
        transfer_queue.close()
    assert transfer_queue.get_metrics_endpoint() is None


@ray.remote(num_cpus=0)
def _endpoint() -> str:
    import tq.compat as transfer_queue

    transfer_queue.init()
    try:
        return transfer_queue.get_metrics_endpoint()
    finally:
        transfer_queue.close()


def test_a_second_init_in_the_driver_attaches(ray_cluster) -> None:
    transfer_queue.init(CONF)
    try:
        first = transfer_queue.get_client()
        assert transfer_queue.init(CONF) is not None
        assert transfer_queue.get_client()._client is first._client
    finally:
        transfer_queue.close()


def test_a_refused_configuration_creates_no_actor(ray_cluster) -> None:
    with pytest.raises(tq.UnsupportedError, match="MooncakeStore"):
        transfer_queue.init({"backend": {"storage_backend": "MooncakeStore"}})
    with pytest.raises(ValueError):
        _controller_actor()


@ray.remote(num_cpus=0)
def _produce(start: int, n: int) -> None:
    import tensordict
    import torch

    import tq.compat as transfer_queue

    transfer_queue.init()
    ids = torch.arange(start, start + n)
    transfer_queue.get_client().put(data=tensordict.TensorDict({"x": ids}, batch_size=[n]), partition_id="train")
    transfer_queue.close()


@ray.remote(num_cpus=0)
class _Consumer:
    """Fetches and reads batches of `train` for task `train`."""

    def __init__(self) -> None:
        import tq.compat as transfer_queue

        self.tq = transfer_queue
        self.tq.init()
        self.client = transfer_queue.get_client()

    def fetch_only(self, n: int) -> list:
        """Takes a batch and never reads it (this consumer is about to die)."""
        return self.client.get_meta(data_fields=["x"], batch_size=n, partition_id="train", task_name="train").global_indexes

    def drain(self, total: int) -> list:
        """Reads batches until the task consumed all ``total`` samples (acknowledged, not just
        leased); a fetch that times out means the others hold the rest for now."""
        import tq

        got = []
        while True:
            try:
                meta = self.client.get_meta(data_fields=["x"], batch_size=1, partition_id="train", task_name="train")
            except tq.TimeoutError:
                status = self.client._client.partition("train").consumption_status("train")
                if sum(status["consumed"]) == total:
                    return got
                continue
            assert len(self.client.get_data(meta)["x"]) == 1
            got.extend(meta.global_indexes)


def test_samples_a_dead_consumer_fetched_are_delivered_again_and_each_once(ray_cluster) -> None:
    conf = {**CONF, "backend": {**CONF["backend"], "tq": {"host": "127.0.0.1", "lease_seconds": 2.0}}}
    transfer_queue.init(conf)
    try:
        ray.get([_produce.remote(0, 10), _produce.remote(10, 10)])
        fast = {"env_vars": {"TQ_CONTROLLER_FETCH_TIMEOUT_MS": "3000"}}  # waits end, the loop re-checks
        doomed = _Consumer.options(runtime_env=fast).remote()
        lost = ray.get(doomed.fetch_only.remote(4))
        assert len(lost) == 4
        ray.kill(doomed)
        consumers = [_Consumer.options(runtime_env=fast).remote() for _ in range(2)]
        read = ray.get([c.drain.remote(20) for c in consumers])
        everything = sorted(read[0] + read[1])
        assert everything == list(range(20))  # every sample read once, the dead one's 4 included
        assert set(lost) <= set(everything)
        for c in consumers:
            ray.kill(c)
    finally:
        transfer_queue.close()
