"""The live run's records, written by `make train` as verl runs and when it ends: the step table it prints
(one row a step, in the columns of the published NPU run), the run folder's metrics.jsonl (every attempt's
steps merged), steps.md and the reward and response-length plots (drawn as the report's, plots.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from tools import atomic
from tools.analysis import learning
from tools.report import plots
from tools.report.runs import responses_per_step
from tools.report.table import generation_and_reshard
from tools.reward import tally

if TYPE_CHECKING:
    from tools.launch.run import Run

# The per-step table in the columns of the published NPU run: (header, verl metric, format)
# gen and reshard: tools.report.generation_and_reshard (the engine's generation; the weights handed
# from the actor to the rollout engine), from what the stack's verl logs.
COLUMNS: list[tuple[str, str, str]] = [
    ("step", "step", "{:>4d}"),
    ("gen s", "gen", "{:>7.2f}"),
    ("reshard s", "reshard", "{:>9.2f}"),
    ("reward s", "timing_s/reward", "{:>8.2f}"),
    ("old_lp s", "timing_s/old_log_prob", "{:>8.2f}"),
    ("ref s", "timing_s/ref", "{:>6.2f}"),
    ("update s", "timing_s/update_actor", "{:>8.2f}"),
    ("step s", "timing_s/step", "{:>7.2f}"),
    ("tok/s/dev", "perf/throughput", "{:>9.1f}"),
    ("prompt", "prompt_length/mean", "{:>7.1f}"),
    ("response", "response_length/mean", "{:>8.1f}"),
    ("reward", "critic/rewards/mean", "{:>7.3f}"),
    ("pg_loss", "actor/pg_loss", "{:>9.2e}"),
    ("kl_loss", "actor/kl_loss", "{:>9.2e}"),
]


def derived(data: dict[str, float]) -> dict[str, float]:
    out = dict(data)
    gen, reshard = generation_and_reshard(data)
    if gen is not None:
        out["gen"] = gen
    if reshard is not None:
        out["reshard"] = reshard
    return out


def table_header() -> str:
    widths = [len(f.format(0 if k == "step" else 0.0)) for _, k, f in COLUMNS]
    return " ".join(h.rjust(w) for (h, _, _), w in zip(COLUMNS, widths, strict=True))


def table_row(step: int, data: dict[str, float]) -> str:
    cells = []
    for _, key, fmt in COLUMNS:
        width = len(fmt.format(0 if key == "step" else 0.0))
        value = step if key == "step" else data.get(key)
        cells.append("-".rjust(width) if value is None else fmt.format(value))
    return " ".join(cells)


def is_train_step(data: dict[str, float]) -> bool:
    return "timing_s/step" in data


def read_metrics(run: Path) -> list[dict[str, Any]]:
    """The run folder's metrics.jsonl records ([] before the first step)."""
    path = run / "metrics.jsonl"
    return learning.read_jsonl(path) if path.exists() else []


def reward_tally(
    run: Path, attempt: int, cfg: Any, records: list[tuple[int, dict[str, float]]]
) -> dict[int, dict[str, float]]:
    """step -> reward/format, reward/accuracy, reward/timeouts (answers the grader cut off at its time limit
    or the batch's deadline, a count) and reward/seconds of this attempt's training steps: the reward
    function's tally (tools/reward/tally.py), which verl does not log for training steps."""
    path = tally.path_for(run / f"verl-metrics-{attempt}.jsonl")
    trained = [s for s, d in records if is_train_step(d)]
    if path is None or not path.is_file() or not trained:
        return {}
    return tally.per_step(tally.read(path), responses_per_step(cfg), min(trained))


def merge_metrics(
    run: Path,
    attempt: int,
    records: list[tuple[int, dict[str, float]]],
    reward: dict[int, dict[str, float]] | None = None,
) -> list[dict]:
    """metrics.jsonl: one record per training step over every attempt (a resumed run replaces the
    steps it trains again), with `reward` (reward_tally) in its step's metrics, plus validation records
    ("kind": "validation")."""
    old = read_metrics(run)
    new = []
    for step, data in records:
        # verl logs the end-of-training validation in the same line as the last step's metrics
        val = {k: v for k, v in data.items() if k.startswith("val-")}
        rest = {k: v for k, v in data.items() if not k.startswith("val-")}
        if val:
            new.append({"step": step, "kind": "validation", "attempt": attempt, "metrics": val})
        if is_train_step(rest):
            m = {**derived(rest), **(reward or {}).get(step, {})}
            new.append({"step": step, "kind": "train", "attempt": attempt, "metrics": m})
    redone = {(r["step"], r["kind"]) for r in new}
    return _write_metrics(run, [r for r in old if (r["step"], r["kind"]) not in redone] + new)


def _write_metrics(run: Path, rows: list[dict]) -> list[dict]:
    """metrics.jsonl from `rows`, in step order (a step's validation before its training record); the rows."""
    rows = sorted(rows, key=lambda r: (r["step"], r["kind"] != "validation"))
    atomic.write_bytes(run / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    return rows


UNLOGGED = "trained and saved, but the run ended before verl logged the step's metrics"


def add_unlogged(
    run: Path, attempt: int, merged: list[dict], saved: Sequence[int]
) -> tuple[list[dict], list[int]]:
    """A row ("metrics": {}, "unlogged": why) for each step with a sealed checkpoint (`saved`) and no training
    record: verl saves a step before its weight sync, validation and metrics (V1 trainer), so a stop or a
    failure in between leaves a checkpoint the records would otherwise not have. The step's training is in the
    checkpoint and a resume starts after it; what was lost is its metrics, and the row says so. Returns the
    records, rewritten to metrics.jsonl when rows were added, and the steps added."""
    trained = {r["step"] for r in merged if r["kind"] == "train"}
    missing = sorted(set(saved) - trained)
    if not missing:
        return merged, []
    rows = [
        {"step": n, "kind": "train", "attempt": attempt, "metrics": {}, "unlogged": UNLOGGED} for n in missing
    ]
    return _write_metrics(run, merged + rows), missing


def write_steps_table(run: Path, merged: list[dict]) -> None:
    """steps.md: the printed step table as markdown (a step whose metrics were never logged: a row of dashes
    and a note under the table)."""
    heads = [h for h, _, _ in COLUMNS]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    notes = []
    for r in merged:
        if r["kind"] != "train":
            continue
        m = r["metrics"]
        cells = [str(r["step"])] + ["-" if m.get(k) is None else f"{m[k]:.4g}" for _, k, _ in COLUMNS[1:]]
        lines.append("| " + " | ".join(cells) + " |")
        if r.get("unlogged"):
            notes.append(f"Step {r['step']}: {r['unlogged']}.")
    if notes:
        lines += ["", *notes]
    atomic.write_bytes(run / "steps.md", ("\n".join(lines) + "\n").encode())


def plot(run: Path, merged: list[dict], wanted_key: str | None = None) -> list[Path]:
    """reward.png and response_length.png over the training steps; with `wanted_key` (a recipe with
    launch.learning) also learning.png, the learning curve."""
    train = [r for r in merged if r["kind"] == "train"]
    steps = [r["step"] for r in train]
    out = []
    for name, key, label in (
        ("reward.png", "critic/rewards/mean", "reward mean"),
        ("response_length.png", "response_length/mean", "response length (tokens, mean)"),
    ):
        series = (label, steps, [r["metrics"].get(key) for r in train])
        # each restart (tools/launch/restart_records.py): where it failed, what it resumed from
        restarts = [(r["failed_at_step"] - 0.5, f"restart: {r['cause']} in step {r['failed_at_step']}, from"
                     f" {r['resumed_from']}") for r in merged if r["kind"] == "restart"]  # fmt: skip
        png = plots.lines(f"{run.name}: {label}", label, [(0, 0, series)], (6, 3.5), vlines=restarts)
        atomic.write_bytes(run / name, png)
        out.append(run / name)
    png = learning.plot(learning.run_curve(run, wanted_key), run.name) if wanted_key is not None else None
    if png:
        atomic.write_bytes(run / "learning.png", png)
        out.append(run / "learning.png")
    return out


def redraw(run: Path, merged: list[dict[str, Any]]) -> None:
    """steps.md and the plots again, from the records kept (a resume that dropped later steps)."""
    write_steps_table(run, merged)
    plot(run, merged)


def record_attempt(
    run: Run, attempt: int, records: list, timeline: dict[str, Any], wall_s: float, saved: Sequence[int] = ()
) -> list[int]:
    """timeline.json, metrics.jsonl, steps.md and the plots of the run folder, after every attempt; `saved`:
    the steps whose checkpoints this attempt sealed (add_unlogged). Returns the steps recorded as unlogged."""
    timeline.update(launcher_start_to_verl=0.0, resumed_from_step=run.start, wall_s=wall_s)
    path = run.folder / "timeline.json"
    hist = json.loads(path.read_text()) if path.exists() else {}
    hist[str(attempt)] = timeline
    atomic.write_json(path, hist)
    reward = reward_tally(run.folder, attempt, run.cfg, records)  # grader timeouts etc. a step
    merged = merge_metrics(run.folder, attempt, records, reward) if records else read_metrics(run.folder)
    merged, unlogged = add_unlogged(run.folder, attempt, merged, saved)
    base = Path(run.launch.paths.hf_model) / "base_model.json" if "base_model" in run.launch else None
    if base is not None and base.is_file():
        atomic.copy_file(base, run.folder / "base_model.json")
    if merged:
        write_steps_table(run.folder, merged)
        plot(run.folder, merged, learn_key(run) if "learning" in run.launch else None)
    return unlogged


def learn_key(run: Run) -> str | None:
    """The metric a learning recipe judges by (launch.learning.accuracy_key), if it names one."""
    return OmegaConf.select(run.cfg, "launch.learning.accuracy_key", default=None)
