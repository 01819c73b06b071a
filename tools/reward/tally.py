"""The reward's parts per training step: format, accuracy and grader timeouts, which verl does not log.

verl averages the reward function's extra keys (`acc`, `format`, `timeout`) for validation only
(`val-aux/<data source>/<key>/mean@<n>`); for a training step it logs the combined score alone
(`critic/score/mean`). So the reward function (tools/reward/verl_reward.py) appends one line per call
to a JSONL file beside verl's file-logger output (`$VERL_FILE_LOGGER_PATH`, which `make train` sets per
attempt: verl-metrics-<attempt>.jsonl -> reward-tally-<attempt>.jsonl):

    {"split": "train", "n": 1, "format": 1, "acc": 0, "timeouts": 0, "score": 0.33, "seconds": 0.002}

(a part the reward does not return is left out, not written as 0: long addition writes acc, score and
trace). Nothing is written when that variable is not set (verl run by hand, the tests). In sync a training
step scores exactly `batch x rollout.n` training responses, and a step's scoring ends before the next
step's starts, so the k-th block of that many `split: train` responses is step k of the attempt
(`per_step`); the validation responses (`split: test`, from the data's extra_info) are left out. In the
async modes that does not hold (verl scores responses as they finish, runs a warm-up batch ahead and drops
stale groups): there the trainer's sampler (tools/verl_plugins/tallied_sampler.py) writes one line per step from
the groups the step trains on, `{"split": "train", "step": 7, "n": 16, "acc": ..}`, and `per_step` reads
those. Lines are short single writes with O_APPEND, so processes scoring at once (verl 0.9.1's reward
workers) do not interleave.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tools.records import read_jsonl

ENV = "VERL_FILE_LOGGER_PATH"
PREFIX = "reward-tally-"
# the per-step keys the report reads (tools/report): fractions of the step's responses, and a count
# (reward/seconds: the reward function's own time, summed over its calls: overlapping calls count each)
KEYS = {
    "format": "reward/format",
    "acc": "reward/accuracy",
    "timeouts": "reward/timeouts",
    "seconds": "reward/seconds",
}
# a task's own per-response keys, logged per step when its reward returns them (tools/tasks: the share of
# responses that wrote the long-addition trace)
TASK_KEYS = {"trace": "reward/trace"}
# a line's key -> the key of score_responses's (or a task's) result it sums
PARTS = {"format": "format", "acc": "acc", "timeouts": "timeout", "score": "score"}


def split_keys(key: str) -> tuple[str, str]:
    """The per-step accuracy of the responses with a task's flag and of those without (does the trace pay?
    the edge a run's response length can grow from): reward/accuracy_with_trace, .._without_trace."""
    return f"reward/accuracy_with_{key}", f"reward/accuracy_without_{key}"


def path_for(metrics_path: str | os.PathLike | None) -> Path | None:
    """reward-tally-<attempt>.jsonl beside verl's file-logger output (None when there is none)."""
    if not metrics_path:
        return None
    p = Path(metrics_path)
    suffix = p.stem.rsplit("-", 1)[-1] if "-" in p.stem else p.stem
    return p.with_name(f"{PREFIX}{suffix}.jsonl")


def record(results: Sequence[Mapping[str, float]], extra_infos: Iterable[Any] | None, seconds: float) -> None:
    """Append one line for a scoring call (`results`: score_responses's dicts, `seconds` it took);
    never raises."""
    path = path_for(os.environ.get(ENV))
    if path is None or not results:
        return
    infos = list(extra_infos) if extra_infos is not None else []
    split = next((i.get("split") for i in infos if isinstance(i, Mapping) and i.get("split")), None)
    line: dict[str, Any] = {"split": split or "unknown", "n": len(results)}
    if split == "train":  # the prompts scored: the run's prompt record (tools/launch/prompt_record.py)
        line["prompts"] = [i.get("index") if isinstance(i, Mapping) else None for i in infos]
    # a part the reward did not return is left out, not written as 0 (long addition has no format term and
    # no grader to time out): the report then says "not logged"
    for key, result_key in PARTS.items():
        if any(result_key in r for r in results):
            line[key] = sum(r.get(result_key, 0.0) for r in results)
    line["seconds"] = round(seconds, 6)
    for key in TASK_KEYS:
        if any(key in r for r in results):
            line[key] = sum(r.get(key, 0.0) for r in results)
            line[f"{key}_acc"] = sum(r.get("acc", 0.0) for r in results if r.get(key))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # a tally is a report's extra: never fail a training step for it


def read(path: Path) -> list[dict[str, Any]]:
    """The lines of a tally file; a torn last line (a live run) is skipped."""
    return read_jsonl(path, keep=lambda rec: isinstance(rec, dict) and isinstance(rec.get("n"), int | float))


def record_trained(
    step: int,
    reward_extra_infos: Sequence[Mapping[str, Any]],
    prompts: Sequence[Any] | None = None,
    fetched_for: Sequence[Any] | None = None,
) -> None:
    """Append the line of training step `step` from the responses it trains on (their reward results, as
    verl keeps them: each trajectory's `extra_fields.reward_extra_info`): written by the trainer's sampler
    (tools/verl_plugins/tallied_sampler.py) in the async modes, where a step's responses were scored earlier
    and among others. `prompts`: each response's prompt (its data row's extra_info index), in the order of
    the step's batch; `fetched_for`: the step each was taken from the dataloader for (tools/launch/
    prompt_record.py). Never raises."""
    path = path_for(os.environ.get(ENV))
    results = [r for r in reward_extra_infos if isinstance(r, Mapping)]
    if path is None or not results:
        return
    line: dict[str, Any] = {"split": "train", "step": int(step), "n": len(results)}
    if prompts is not None:
        line["prompts"] = list(prompts)
    if fetched_for is not None:
        line["fetched_for"] = list(fetched_for)
    for key, result_key in PARTS.items():
        if any(result_key in r for r in results):
            line[key] = sum(float(r.get(result_key, 0.0)) for r in results)
    for key in TASK_KEYS:
        if any(key in r for r in results):
            line[key] = sum(float(r.get(key, 0.0)) for r in results)
            line[f"{key}_acc"] = sum(float(r.get("acc", 0.0)) for r in results if r.get(key))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def per_step(
    lines: Iterable[Mapping[str, Any]], per_step_n: int, first_step: int
) -> dict[int, dict[str, float]]:
    """step -> {reward/format, reward/accuracy (fractions), reward/timeouts (count), reward/seconds, and a
    task's keys}, each only where the reward returned it (a part it did not return is absent: "not logged").

    Lines that name their step (`record_trained`: the async modes, where verl 0.9.1 scores in the agent loop,
    runs warm-up batches ahead and drops stale groups) are the steps: the reward function's own lines are then
    left out, since they cannot say which step trains on their responses (reward/seconds is not logged
    there). Otherwise (sync: a step's scoring ends before the next starts) block k of `per_step_n` training
    responses is step first_step + k."""
    train = [r for r in lines if r.get("split") == "train"]
    keyed = [r for r in train if isinstance(r.get("step"), int | float)]
    out: dict[int, dict[str, float]] = {}
    if keyed:
        steps: dict[int, list[Mapping[str, Any]]] = {}
        for rec in keyed:
            steps.setdefault(int(rec["step"]), []).append(rec)
        return {step: _summary(block) for step, block in sorted(steps.items())}
    if per_step_n <= 0:
        return {}
    block: list[Mapping[str, Any]] = []
    seen = 0
    for rec in train:
        block.append(rec)
        seen += int(rec["n"])
        if seen >= per_step_n:  # calls score whole batches or single responses: a block ends exactly here
            out[first_step + len(out)] = _summary(block)
            block, seen = [], 0
    return out


def _summary(block: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """One step's figures from its lines; a part only where every line has it."""
    n = sum(float(r["n"]) for r in block) or 1.0

    def total(key: str) -> float | None:
        return sum(float(r[key]) for r in block) if all(key in r for r in block) else None

    out: dict[str, float] = {}
    for key, name in KEYS.items():
        value = total(key)
        if value is not None:
            out[name] = value / n if key in ("format", "acc") else value
    acc = total("acc")
    for key, name in TASK_KEYS.items():
        flagged = total(key)
        if flagged is None:
            continue
        out[name] = flagged / n
        # the accuracy of the flagged responses; a file from before {key}_acc: one response a line
        parts = [float(r[f"{key}_acc"]) if f"{key}_acc" in r else
                 float(r[key]) * float(r.get("acc", 0.0)) if r["n"] == 1 else None for r in block]  # fmt: skip
        if acc is None or any(x is None for x in parts):
            continue
        flagged_acc = sum(x for x in parts if x is not None)
        with_key, without_key = split_keys(key)
        if flagged > 0:
            out[with_key] = flagged_acc / flagged
        if n - flagged > 0:
            out[without_key] = (acc - flagged_acc) / (n - flagged)
    return out
