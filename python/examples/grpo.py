"""A GRPO-style pipeline on tq from Python: prompts -> rollout -> reward -> trainer.

Each stage is a thread with its own task name; stages hand samples on through tq instead of
calling each other, as the stages of an RL post-training job do (in real jobs they are
processes on many machines: use ``tq.connect(url)`` there instead of ``Client.embedded``).

    python python/examples/grpo.py [--prompts 64] [--group 4] [--connect tcp://host:port]

With --connect, the deployment must have the sampler: start it with a configuration file
holding ``[controller.samplers]`` ``grpo = "grpo:4"`` (``tq serve --config FILE``).

It checks at the end that every response was trained on exactly once, and says so.
"""

from __future__ import annotations

import argparse
import threading
from collections import Counter

import numpy as np

import tq


def rollout(client: tq.Client, group: int) -> None:
    """Takes prompts and writes `group` responses for each, one group per put (so a group is
    contiguous, which the GRPO sampler relies on)."""
    prompts, rollouts = client.partition("prompts"), client.partition("rollouts")
    while True:
        try:
            batch = prompts.fetch(["prompt"], task="rollout", batch_size=8)
        except tq.ClosedError:
            break
        data = client.get_data(batch)
        for pid, prompt in zip(batch.global_indexes, data["prompt"]):
            responses = np.stack([prompt * 10 + j for j in range(group)])
            rollouts.put({
                "response": responses,
                "prompt_id": np.full((group, 1), pid, dtype=np.int64),
                "text": [f"answer {j} to prompt {pid}" for j in range(group)],
            })
        client.clear_samples(batch)
    rollouts.complete()


def reward(client: tq.Client) -> None:
    """Scores responses and writes the score into the same samples."""
    rollouts = client.partition("rollouts")
    while True:
        try:
            batch = rollouts.fetch(["response"], task="reward", batch_size=16)
        except tq.ClosedError:
            break
        responses = client.get_data(batch)["response"]
        client.put(batch, {"reward": responses.sum(axis=1, keepdims=True).astype(np.float32)})


def train(client: tq.Client, group: int, seen: Counter) -> None:
    """Trains on whole groups (the GRPO sampler) once they are rewarded, then clears them."""
    rollouts = client.partition("rollouts")
    while True:
        try:
            batch = rollouts.fetch(["response", "reward", "text"], task="train", batch_size=2 * group, sampler="grpo")
        except tq.ClosedError:
            break
        data = client.get_data(batch)
        rewards = data["reward"][:, 0].reshape(-1, group)
        advantages = rewards - rewards.mean(axis=1, keepdims=True)  # what GRPO would use
        assert advantages.shape[1] == group, "a batch holds whole groups"
        seen.update(data["text"])
        client.clear_samples(batch)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--group", type=int, default=4, help="responses per prompt")
    parser.add_argument("--connect", help="a running deployment (tq serve) instead of an embedded one")
    args = parser.parse_args()
    config = {"controller": {"samplers": {"grpo": f"grpo:{args.group}"}}}
    # A deployment names its samplers itself: start it with a configuration that has
    # [controller.samplers] grpo = "grpo:<group>" (tq serve --config FILE).
    client = tq.connect(args.connect) if args.connect else tq.Client.embedded(config)
    with client:
        prompts = client.partition("prompts")
        prompts.put({"prompt": np.arange(args.prompts * 3, dtype=np.int64).reshape(args.prompts, 3)})
        prompts.complete()
        seen: Counter = Counter()
        stages = [
            threading.Thread(target=rollout, args=(client, args.group)),
            threading.Thread(target=reward, args=(client,)),
            threading.Thread(target=train, args=(client, args.group, seen)),
        ]
        for s in stages:
            s.start()
        for s in stages:
            s.join()
        expected = args.prompts * args.group
        once = len(seen) == expected and all(n == 1 for n in seen.values())
        client.partition("rollouts").clear()
        client.partition("prompts").clear()
        print(f"trained on {sum(seen.values())} responses of {args.prompts} prompts x {args.group}")
        print("check: OK, every response trained exactly once" if once else "check: FAILED")
        return 0 if once else 1


if __name__ == "__main__":
    raise SystemExit(main())
