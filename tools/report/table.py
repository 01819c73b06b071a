"""The step table in the published run's columns: steps.md, steps.jsonl and the page's table.

Columns, as the published step table of the 671B run:
    prompt / response length   prompt_length/mean, response_length/mean (tokens)
    step                       timing_s/step
    tokens/s per device        total tokens / step time / devices, where total tokens is verl's
                               perf/total_num_tokens (prompt + response tokens of the step; without it:
                               (prompt mean + response mean) x sequences) and devices = ranks /
                               dies_per_device (an A3 NPU package carries 2 dies = 2 ranks: the published
                               "tokens/s per A3"). Equivalently verl's perf/throughput x dies_per_device.
    generation                 timing_s/generate_sequences (the engine's own time; else timing_s/gen)
    reshard                    timing_s/reshard when logged, else timing_s/update_weights (verl 0.9), else
                               timing_s/gen - timing_s/generate_sequences (weight sync and offload/onload
                               around the rollout)
    reward                     timing_s/reward; verl 0.9.1 logs none when the rule reward is scored inside
                               the rollout (its reward-loop workers score each response as it finishes, so
                               the time is part of generation): then the reward function's own seconds
                               from tools/reward/tally.py (reward/seconds), marked "in gen"
    old log-prob, reference, update   timing_s/old_log_prob, /ref, /update_actor
    reward mean                critic/rewards/mean (critic/score/mean when absent)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tools.report.runs import Devices, get


@dataclass(frozen=True)
class Column:
    key: str
    head: str
    fmt: str = "{:.1f}"


COLUMNS = [
    Column("step", "step", "{:d}"),
    Column("prompt_len", "prompt len", "{:.1f}"),
    Column("response_len", "response len", "{:.1f}"),
    Column("step_s", "step (s)", "{:.1f}"),
    Column("tokens_per_s_per_device", "tokens/s per {unit}", "{:.1f}"),
    Column("gen_s", "generate (s)", "{:.1f}"),
    Column("reshard_s", "reshard (s)", "{:.1f}"),
    Column("reward_s", "reward (s)", "{:.1f}"),
    Column("old_log_prob_s", "old log-prob (s)", "{:.1f}"),
    Column("ref_s", "reference (s)", "{:.1f}"),
    Column("update_s", "update (s)", "{:.1f}"),
    Column("reward_mean", "reward mean", "{:.3f}"),
]
SPLIT = [
    ("gen_s", "generate"),
    ("reshard_s", "reshard"),
    ("reward_s", "reward"),
    ("old_log_prob_s", "old log-prob"),
    ("ref_s", "reference"),
    ("update_s", "update"),
    ("other_s", "other"),
]


def tokens_per_s_per_device(
    total_tokens: float, step_s: float, ranks: float, dies_per_device: int = 1
) -> float:
    """The published table's throughput: all prompt + response tokens of the step / step time / devices."""
    return total_tokens / step_s / (ranks / dies_per_device)


def generation_and_reshard(m: dict[str, Any]) -> tuple[float | None, float | None]:
    """The generation and reshard seconds of a step, from what the verl release in use logs.

    verl 0.6 (published): generation is the engine's generate_sequences; reshard is the rest of its gen
    phase (the switch to rollout mode and back). verl 0.9 (current, server mode): generation is the gen
    phase (the agent loop against the vLLM servers); reshard is update_weights (the weight sync).
    """
    gen_total = get(m, "timing_s/gen")
    gen_engine = get(m, "timing_s/generate_sequences")
    reshard = get(m, "timing_s/reshard", "timing_s/update_weights")
    if reshard is None and gen_total is not None and gen_engine is not None:
        reshard = max(0.0, gen_total - gen_engine)
    return (gen_engine if gen_engine is not None else gen_total), reshard


def row_from_metrics(step: int, m: dict[str, Any], dev: Devices) -> dict[str, Any]:
    gen_s, reshard = generation_and_reshard(m)
    step_s = get(m, "timing_s/step", "perf/time_per_step")
    prompt, response = get(m, "prompt_length/mean"), get(m, "response_length/mean")
    total = get(m, "perf/total_num_tokens")
    ranks = dev.ranks
    if ranks is None and total and step_s and get(m, "perf/throughput"):
        ranks = total / (step_s * get(m, "perf/throughput"))  # verl: throughput = tokens / (time * n_gpus)
    tps = None
    if total and step_s and ranks:
        tps = tokens_per_s_per_device(total, step_s, ranks, dev.dies_per_device)
    row = {
        "step": int(step),
        "prompt_len": prompt,
        "response_len": response,
        "step_s": step_s,
        "tokens_per_s_per_device": tps,
        "gen_s": gen_s,
        "reshard_s": reshard,
        "reward_s": get(m, "timing_s/reward"),
        "reward_in_gen": False,
        "old_log_prob_s": get(m, "timing_s/old_log_prob"),
        "ref_s": get(m, "timing_s/ref"),
        "update_s": get(m, "timing_s/update_actor"),
        "reward_mean": get(m, "critic/rewards/mean", "critic/score/mean"),
    }
    if row["reward_s"] is None and get(m, "reward/seconds") is not None:
        # verl 0.9.1 scored the reward inside its rollout: the reward function's own time, part of gen
        row["reward_s"], row["reward_in_gen"] = get(m, "reward/seconds"), True
    row["reward_stack_s"] = None if row["reward_in_gen"] else row["reward_s"]  # what the split stacks
    if step_s is not None:
        parts = [row[k] or 0.0 for k, _ in SPLIT[:-1] if not (k == "reward_s" and row["reward_in_gen"])]
        row["other_s"] = max(0.0, step_s - sum(parts))
    return row


def cell(col: Column, row: dict[str, Any]) -> str:
    value = row.get(col.key)
    if value is None:
        return "-"
    short = col.fmt == "{:.1f}" and abs(value) < 10  # short runs: seconds and lengths below 10 get 2 decimals
    text = f"{value:.2f}" if short else col.fmt.format(value)
    if short and 0 < abs(value) < 0.005:  # milliseconds (the reward function's own time) are not 0.00
        text = f"{value:.1e}"
    return text + (" (in gen)" if col.key == "reward_s" and row.get("reward_in_gen") else "")


def markdown(rows: list[dict[str, Any]], unit: str) -> str:
    heads = [c.head.format(unit=unit) for c in COLUMNS]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---:|" * len(heads)]
    lines += ["| " + " | ".join(cell(c, r) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"
