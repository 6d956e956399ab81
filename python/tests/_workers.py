"""Functions that test worker processes run (importable by spawned children)."""

from __future__ import annotations

from typing import Any, List

import numpy as np

import tq

#: A client the parent made before forking (see `check_inherited`).
INHERITED: Any = None


def consume(dataset: tq.StreamingDataset) -> List[int]:
    """Iterates `dataset` to its end; the `x` values of every batch it got."""
    seen: List[int] = []
    for batch in dataset:
        seen += batch["x"][:, 0].tolist()
    return seen


def check_inherited(out: Any) -> None:
    """In a forked child: the parent's client refuses, a new one works."""
    try:
        INHERITED.list_partitions()
        out.put("the inherited client answered")
        return
    except tq.ClosedError as e:
        refused = "fork" in str(e)
    with tq.Client.embedded() as own:
        p = own.partition("child")
        p.kv_put("k", {"x": np.arange(3)})
        value = p.kv_get("k")["x"].tolist()
    out.put(("refused" if refused else "refused without saying why", value))


def compat_worker(rank: int) -> List[int]:
    """A spawned worker of a tq.compat job: attaches with init() (the address comes from the
    environment the parent exported), writes one key, reads one batch for its own task."""
    import torch

    import tq.compat as transfer_queue

    transfer_queue.init()
    try:
        transfer_queue.kv_put(f"w{rank}", "workers", fields={"rank": torch.tensor([rank])})
        client = transfer_queue.get_client()
        meta = client.get_meta(data_fields=["x"], batch_size=2, partition_id="shared", task_name=f"task{rank}")
        return client.get_data(meta)["x"].tolist()
    finally:
        transfer_queue.close()
