"""The reward's parts per training step: format, accuracy and grader timeouts, which verl does not log.

verl averages the reward function's extra keys (`acc`, `format`, `timeout`) for validation only
(`val-aux/<data source>/<key>/mean@<n>`); for a training step it logs the combined score alone
(`critic/score/mean`). So the reward function (tools/reward/verl_reward.py) appends one line per call
to a JSONL file beside verl's file-logger output (`$VERL_FILE_LOGGER_PATH`, which `make train` sets per
attempt: verl-metrics-<attempt>.jsonl -> reward-tally-<attempt>.jsonl):

    {"split": "train", "n": 1, "format": 1, "acc": 0, "timeouts": 0, "score": 0.33, "seconds": 0.002}

Nothing is written when that variable is not set (verl run by hand, the tests). A training step scores
exactly `batch x rollout.n` training responses, and a step's scoring ends before the next step's starts,
so the k-th block of that many `split: train` responses is step k of the attempt (`per_step`); the
validation responses (`split: test`, from the data's extra_info) are left out. Lines are short single
writes with O_APPEND, so processes scoring at once (verl 0.9.1's reward workers) do not interleave.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ENV = "VERL_FILE_LOGGER_PATH"
PREFIX = "reward-tally-"
# the per-step keys the report reads (tools/launch/report): fractions of the step's responses, and a count
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
    out = []
    for line in Path(path).read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("n"), int | float):
            out.append(rec)
    return out


def per_step(
    lines: Iterable[Mapping[str, Any]], per_step_n: int, first_step: int
) -> dict[int, dict[str, float]]:
    """step -> {reward/format, reward/accuracy (fractions), reward/timeouts (count), reward/seconds} of
    the complete steps in `lines`: block k of `per_step_n` training responses is step first_step + k."""
    if per_step_n <= 0:
        return {}
    out: dict[int, dict[str, float]] = {}
    acc = {"n": 0.0, "format": 0.0, "acc": 0.0, "timeouts": 0.0, "seconds": 0.0}
    task = {key: 0.0 for key in TASK_KEYS}
    task_acc = {key: 0.0 for key in TASK_KEYS}  # the accuracy summed over the responses with the flag
    has, split = set(), set(TASK_KEYS)
    seen = 0
    for rec in lines:
        if rec.get("split") != "train":
            continue
        for k in acc:
            acc[k] += float(rec.get(k, 0.0))
        for k in task:
            if k in rec:
                task[k] += float(rec[k])
                has.add(k)
                if f"{k}_acc" in rec:
                    task_acc[k] += float(rec[f"{k}_acc"])
                elif rec["n"] == 1:  # a file from before {key}_acc: one response, its flag and its accuracy
                    task_acc[k] += float(rec[k]) * float(rec.get("acc", 0.0))
                else:
                    split.discard(k)
        seen += int(rec["n"])
        if seen >= per_step_n:  # calls score whole batches or single responses: a block ends exactly here
            step = first_step + len(out)
            n = acc["n"] or 1.0
            out[step] = {
                KEYS["format"]: acc["format"] / n,
                KEYS["acc"]: acc["acc"] / n,
                KEYS["timeouts"]: acc["timeouts"],
                KEYS["seconds"]: acc["seconds"],
                **{TASK_KEYS[k]: task[k] / n for k in sorted(has)},
            }
            for k in sorted(has & split):
                with_key, without_key = split_keys(k)
                if task[k] > 0:
                    out[step][with_key] = task_acc[k] / task[k]
                if n - task[k] > 0:
                    out[step][without_key] = (acc["acc"] - task_acc[k]) / (n - task[k])
            acc = {k: 0.0 for k in acc}
            task = {k: 0.0 for k in task}
            task_acc = {k: 0.0 for k in task}
            has, split = set(), set(TASK_KEYS)
            seen = 0
    return out
