"""verl 0.9.1's async replay buffer, keeping the reward tally per step (recipes/mode/*_async.yaml:
`trainer.v1.sampler.custom_sampler`).

In the async modes verl scores each response in the agent loop as it finishes, runs warm-up batches ahead
and drops groups grown too stale (verl/trainer/ppo/v1/replay_buffer.py `ReplayBufferAsync`): the order in
which the reward function is called says nothing about which step trains on a response. The sampler is
where that is decided, so this subclass writes, after verl's own `sample` has chosen a step's groups, one
tally line for that step from exactly those trajectories' reward results (tools/reward/tally.py
`record_trained`; verl keeps each trajectory's `extra_fields.reward_extra_info` in its TransferQueue
until the step ends). Dropped groups were never chosen, so they are never counted. The training itself is
verl's, untouched: a tally failure is swallowed.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:  # verl loads this file by path, in its trainer process
    sys.path.insert(0, _ROOT)

import transfer_queue as tq  # noqa: E402
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync  # noqa: E402

from tools.reward.tally import record_trained  # noqa: E402


def _values(column: Any) -> list[Any]:
    """A TransferQueue column (a tensor, a NonTensorStack or a list) as plain Python values."""
    if hasattr(column, "tolist"):
        return column.tolist()
    return [getattr(v, "data", v) for v in column]


def trained(batch: Any) -> tuple[list[dict[str, Any]], list[Any], list[Any]]:
    """The trajectories of a sampled batch (verl's KVBatchMeta), padding left out, in the batch's order: their
    reward results, their prompts (the data row's extra_info index, which verl's dataset puts in `index`,
    verl/utils/dataset/rl_dataset.py) and the step each prompt was taken from the dataloader for (the tag
    verl's agent loop writes, verl/trainer/ppo/v1/agent_loop_tq.py)."""
    kept = [
        (k, tag or {})
        for k, tag in zip(batch.keys, batch.tags, strict=True)
        if not (tag or {}).get("is_padding")
    ]
    if not kept:
        return [], [], []
    keys = [k for k, _ in kept]
    try:
        data = tq.kv_batch_get(
            keys=keys, partition_id=batch.partition_id, select_fields=["extra_fields", "index"]
        )
        prompts = _values(data["index"])
    except Exception:  # a batch without verl's `index` (another dataset class): the tally without prompts
        data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
        prompts = [None] * len(keys)
    fields = _values(data["extra_fields"])
    results = [f.get("reward_extra_info") or {} if isinstance(f, dict) else {} for f in fields]
    return results, prompts, [tag.get("global_steps") for _, tag in kept]


class TalliedReplayBufferAsync(ReplayBufferAsync):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # verl passes a custom sampler none of its sampler keys but sampler_kwargs: the recipe's poll interval
        # (recipes/mode/*_async.yaml) comes that way, else verl's 2 s a poll would stall every tiny step
        extra = kwargs.get("sampler_kwargs") or {}
        if "poll_interval" not in kwargs and extra.get("poll_interval") is not None:
            kwargs["poll_interval"] = float(extra["poll_interval"])
        super().__init__(*args, **kwargs)

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict]:
        batch, metrics = super().sample(global_steps, partition_id, batch_size)
        if partition_id == "train":
            with contextlib.suppress(Exception):  # a report's extra must never stop a training step
                results, prompts, fetched_for = trained(batch)
                record_trained(global_steps, results, prompts, fetched_for)
        return batch, metrics
