"""The end of a run in the terminal: what `make train` prints when verl is done (tools/launch/train.py
calls `end_lines` with the run folder), from the same reading of the run as the page."""

from __future__ import annotations

from pathlib import Path

from tools.records import is_accuracy
from tools.report import health, mismatch, overlap, summary
from tools.report.runs import Run, get


def random_tiny_model(run: Run) -> bool:
    """The run's model is one `make train` made with random weights (tiny-cpu*, not tiny-learn's trained
    base model)."""
    launch = run.config.get("launch", {}) if run.config is not None else {}
    paths = launch.get("paths", {}) or {}
    return bool(paths.get("made_by")) and "base_model" not in launch


def flat_reward(run: Run) -> str | None:
    """One line on a reward that did not move, or None."""
    vals = [get(m, "critic/score/mean", "critic/rewards/mean") for m in run.steps.values()]
    vals = [v for v in vals if v is not None]
    if len(vals) < 2 or max(vals) - min(vals) > 1e-9:
        return None
    if random_tiny_model(run):
        return (
            f"reward flat at {vals[0]:.3f}: the tiny model has random weights (not pretrained), so it writes no "
            "answer in the required format to score and GRPO has no signal (all advantages 0); this run shows "
            "that the machinery works, not learning (make train RECIPE=tiny-learn learns)"
        )
    return (
        f"reward flat at {vals[0]:.3f} over {len(vals)} steps: every response of each group scored the same, so "
        "the advantages were 0 (see the reward split and advantages in the report)"
    )


def validation_line(run: Run) -> str | None:
    key, xs, ys = health.validation(run, "acc")
    if not key:
        return None
    first, last = ys[0], ys[-1]
    change = f", {last - first:+.3f} since step {xs[0]}" if len(ys) > 1 else ""
    # several data sources (tiny-zero's digit buckets): the recipe's first, the others beside it
    others = [f"{k}: {v:.3f}" for k, v in sorted(run.validations[xs[-1]].items())
              if k != key and is_accuracy(k) and isinstance(v, int | float)]  # fmt: skip
    rest = f"; the other data sources there: {', '.join(others)}" if others else ""
    return f"validation accuracy {last:.3f} at step {xs[-1]}{change} ({key}){rest}"


def end_lines(run: Run, report_page: Path | None = None) -> list[str]:
    """The lines `make train` prints at the end of a finished attempt."""
    tl = run.timeline
    attempt = max(tl, key=lambda a: int(a) if a.isdigit() else 0) if tl else None
    this = tl.get(attempt, {}) if attempt else {}
    trained = sorted(int(s) for s in (this.get("steps") or {})) or list(run.steps)
    lines = []
    if trained:
        lines.append(
            f"done: steps {trained[0]}..{trained[-1]} in {float(this.get('wall_s', 0) or 0):.1f} s wall; peak memory "
            f"of the process tree {float(this.get('peak_rss_tree_bytes', 0) or 0) / 2**30:.2f} GiB (RSS summed over "
            "its processes: a shared page counts in each; `make bench-train` measures the PSS)"
        )
    ov = overlap.of_run(run)
    if ov is not None:
        lines.append(ov.line())
    v = validation_line(run)
    if v:
        lines.append(v)
    flat = flat_reward(run)
    if flat:
        lines.append(flat)
    mm = mismatch.verdict(run)
    if mm.worth_saying:
        lines.append(mm.line)
    ckpt = summary.checkpoint(run.folder)
    lines.append(
        f"checkpoint: {ckpt} (the next make train resumes from it)"
        if ckpt
        else "no checkpoint saved (verl.trainer.save_freq); the next make train starts afresh"
    )
    lines.append(f"run folder {run.folder}: metrics.jsonl, steps.md, verl.log, config.yaml, command.txt")
    if report_page is not None:
        lines.append(f"report: {report_page} (make report RUN={run.folder} redraws it)")
    return lines
