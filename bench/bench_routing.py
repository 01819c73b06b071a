"""Routing replay measured side by side: R1-Zero in miniature (recipe tiny-zero) without correction and with
routing replay (R3), two seeds each, and what each run's mismatch and learning figures were.

    python bench/bench_routing.py [--seeds 0 1] [--corrections none r3] [--steps N] [--cache DIR] [--keep DIR]
                                  [--set KEY=VALUE ...] [--bound 0.1] [--json FILE]      (make bench-routing)
    python bench/bench_routing.py --runs none-0=outputs/current/a r3-0=outputs/current/b ...
                                                          (only the table, from run folders made before)

Each run is bench/bench_zero.py's main run of the seed (`tools.miniature.assets` then `make train
RECIPE=tiny-zero --fresh`, timed, its process tree sampled) with `correction=<c>` (recipes/correction/), in
its own run folder under `<keep>/<c>/outputs/`. The runs of one seed share its base model (--cache), so the
two arms start from the same weights. With --keep, a run whose result is already there is not run again
(`<keep>/result-<c>-<seed>.json`): an interrupted bench resumes.

The base model is the recipe's (two torch threads): pre-trained with one (`--set launch.base_model.threads=1`),
the seed-0 base model missed its forced-trace gate (0.56 against 1.0 with two, docs/r1-zero.md): the thread
count changes the summation order and with it where pre-training ends up, not only the rounding.

The table, one column a run (`summarise`, from the run folder alone):
  training/rollout_probs_diff_max and _mean  verl's |p_rollout - p_actor| per token, worst and mean of a step:
                                             the max and the mean over the steps
  steps with a token above the bound         the share of steps whose rollout_probs_diff_max > --bound (0.1,
                                             the report's launch.health.mismatch_bound default)
  rollout/routing_disagreement (mean)        the share of tokens the two routers sent to different experts,
                                             where the run logged it (launch.measure_routing; under R3 the
                                             tokens the actor's own router would have sent elsewhere)
  rollout/mismatch_routing_share (mean)      the share of the summed |p_rollout - p_actor| those tokens carry
  the report's mismatch line                 tools/report/mismatch.py's cause (hand-over fault, routing,
                                             precision) with the run's own bound
  learning                                   tools/analysis/reasoning.py's figures and checks (docs/r1-zero.md):
                                             length ratio, hard buckets' sampled and greedy accuracy, trace rate
  step time                                  the mean of verl's timing_s/step
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script (make bench-routing): the checkout's tools

from bench import bench_zero  # noqa: E402
from tools.analysis import reasoning  # noqa: E402
from tools.atomic import write_json  # noqa: E402
from tools.errors import UserError, run_cli  # noqa: E402
from tools.report import mismatch, runs  # noqa: E402
from tools.report.runs import get  # noqa: E402

CORRECTIONS = sorted(p.stem for p in (REPO / "recipes" / "correction").glob("*.yaml"))


def _finite(run: runs.Run, key: str) -> list[float]:
    return [v for m in run.steps.values() if (v := get(m, key)) is not None and math.isfinite(v)]


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def summarise(folder: Path, bound: float = mismatch.DEFAULT_BOUND) -> dict[str, Any]:
    """One run folder's figures: the mismatch (verl's training/rollout_probs_diff_*), the routing disagreement,
    the report's mismatch cause, the learning figures and checks (NaN where the run has no validation of the
    addition buckets) and the mean step time."""
    run = runs.read(folder)
    worst, mean = _finite(run, mismatch.MAX), _finite(run, mismatch.MEAN)
    routing = _finite(run, mismatch.DISAGREEMENT)
    routing_share = _finite(run, mismatch.ROUTING_SHARE)
    step_s = _finite(run, "timing_s/step")
    out: dict[str, Any] = {
        "folder": str(folder),
        "steps": len(run.steps),
        "correction": OmegaConf.select(run.config, "launch.correction.name")
        if run.config is not None
        else None,
        "diff_max_max": max(worst, default=math.nan),
        "diff_max_mean": _mean(worst),
        "diff_mean_max": max(mean, default=math.nan),
        "diff_mean_mean": _mean(mean),
        "bound": bound,
        "above_bound": sum(v > bound for v in worst),
        "measured_steps": len(worst),
        "routing_disagreement_mean": _mean(routing),
        "routing_steps": len(routing),
        "routing_share_mean": _mean(routing_share),
        "cause": mismatch.verdict(run).cause,
        "step_s_mean": _mean(step_s),
        "figures": None,
        "checks": [],
    }
    pic = reasoning.picture(run)
    if pic is not None:
        fig = reasoning.figures(pic)
        out["figures"] = fig
        out["checks"] = [c.__dict__ for c in reasoning.checks(fig, reasoning.kind_of(run.config))]
    return out


def _num(v: float, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def table(named: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """The side-by-side table (markdown), one column a run."""

    def fig(s: dict[str, Any], key: str) -> float:
        return (s["figures"] or {}).get(key, math.nan)

    def share(s: dict[str, Any]) -> str:
        n = s["measured_steps"]
        return f"{s['above_bound'] / n:.2f} ({s['above_bound']} of {n})" if n else "-"

    def routing(key: str, fmt: str) -> Callable[[dict[str, Any]], str]:
        return lambda s: _num(s[key], fmt) if s["routing_steps"] else "not logged"

    def arrow(s: dict[str, Any], first: str, last: str, fmt: str, signed: bool = True) -> str:
        a, b = fig(s, first), fig(s, last)
        if math.isnan(a) or math.isnan(b):
            return "-"
        return f"{a:{fmt}} -> {b:{fmt}}" + (f" ({b - a:+{fmt}})" if signed else "")

    def length(s: dict[str, Any]) -> str:
        r = fig(s, "length_ratio")
        return (
            "-"
            if math.isnan(r)
            else arrow(s, "length_first5", "length_last10", ".1f", False) + f" (x{r:.2f})"
        )

    def checks(s: dict[str, Any]) -> str:
        cs = s["checks"]
        return f"{sum(c['met'] for c in cs)} of {len(cs)}" if cs else "-"

    bound = {s["bound"] for _, s in named}
    rows: list[tuple[str, Any]] = [
        ("correction (launch.correction.name)", lambda s: s["correction"] or "-"),
        ("steps", lambda s: str(s["steps"])),
        ("training/rollout_probs_diff_max: max over the steps", lambda s: _num(s["diff_max_max"], ".3g")),
        ("training/rollout_probs_diff_max: mean over the steps", lambda s: _num(s["diff_max_mean"], ".3g")),
        ("training/rollout_probs_diff_mean: max over the steps", lambda s: _num(s["diff_mean_max"], ".3g")),
        ("training/rollout_probs_diff_mean: mean over the steps", lambda s: _num(s["diff_mean_mean"], ".3g")),
        (f"share of steps with rollout_probs_diff_max > {'/'.join(f'{b:g}' for b in sorted(bound))}", share),
        ("rollout/routing_disagreement: mean over the steps", routing("routing_disagreement_mean", ".2%")),
        ("rollout/mismatch_routing_share: mean over the steps", routing("routing_share_mean", ".1%")),
        ("the report's mismatch cause (tools/report/mismatch.py)", lambda s: s["cause"]),
        ("mean response length, first 5 -> last 10 steps", length),
        ("sampled accuracy, two hardest buckets, first -> last validation",
         lambda s: arrow(s, "sampled_hard_first", "sampled_hard_last", ".2f")),
        ("greedy accuracy, two hardest buckets, base -> trained",
         lambda s: arrow(s, "greedy_hard_before", "greedy_hard_after", ".2f")),
        ("trace rate, last 10 steps", lambda s: _num(fig(s, "trace_last10"), ".2f")),
        ("learning checks met (tools/analysis/reasoning.py)", checks),
        ("step time, mean of timing_s/step (s)", lambda s: _num(s["step_s_mean"], ".1f")),
    ]  # fmt: skip
    out = ["| figure | " + " | ".join(name for name, _ in named) + " |", "|---" * (len(named) + 1) + "|"]
    out += [f"| {label} | " + " | ".join(cell(s) for _, s in named) + " |" for label, cell in rows]
    return out


def parse_runs(items: Sequence[str]) -> list[tuple[str, Path]]:
    """`NAME=PATH` pairs (a run folder or a metrics file each)."""
    out = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise UserError(
                f"--runs {item!r}: want NAME=PATH (a column name and a run folder)",
                fix="e.g. --runs none-0=outputs/current/zero-none-0 r3-0=outputs/current/zero-r3-0",
            )
        if not Path(path).exists():
            raise UserError(
                f"--runs {name}: {path}: no such run folder", fix="pass the folder make train wrote"
            )
        out.append((name, Path(path)))
    if len({n for n, _ in out}) != len(out):
        raise UserError(f"--runs: a name given twice in {' '.join(items)}", fix="give each run its own name")
    return out


def measure(a: argparse.Namespace) -> list[tuple[str, Path]]:
    """Run each (correction, seed) with bench_zero's main run; (name, run folder) of each."""
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()}")
    done: list[tuple[str, Path]] = []
    with tempfile.TemporaryDirectory(prefix="bench-routing-") as tmp_name:
        tmp = Path(a.keep).resolve() if a.keep else Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        cache = Path(a.cache).resolve() if a.cache else tmp / "build"
        results = []
        for seed in a.seeds:  # both arms of a seed one after the other: the base model is made once
            for corr in a.corrections:
                name = f"{corr}-{seed}"
                saved = tmp / f"result-{name}.json"
                if saved.is_file() and Path(json.loads(saved.read_text())["folder"]).is_dir():
                    r = json.loads(saved.read_text())
                    print(f"\n== {name}: done before ({r['folder']}), not run again")
                else:
                    print(f"\n== {name}: tiny-zero seed {seed}, correction={corr}")
                    (tmp / corr).mkdir(parents=True, exist_ok=True)
                    r = bench_zero.run_one(
                        f"main-{seed}", tmp / corr, cache, a.steps, [f"correction={corr}", *a.set]
                    )
                    write_json(saved, r)
                    bench_zero.report(r)
                results.append(r)
                done.append((name, Path(r["folder"])))
        if not a.keep:  # the folders go with the temporary directory: the table now
            print_table(done, a)
            return []
    return done


def print_table(named: Sequence[tuple[str, Path]], a: argparse.Namespace) -> None:
    summaries = [(name, summarise(folder, a.bound)) for name, folder in named]
    print("\n" + "\n".join(table(summaries)))
    for name, s in summaries:
        missed = [c["name"] for c in s["checks"] if not c["met"]]
        if missed:
            print(f"{name}: missed {'; '.join(missed)}")
    if a.json:
        write_json(Path(a.json), [{"name": n, **s} for n, s in summaries])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--corrections", nargs="+", default=["none", "r3"], choices=CORRECTIONS)
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the recipe's, 80)")
    ap.add_argument("--cache", help="base models from (and into) this folder (ASCEND_R1_ZERO)")
    ap.add_argument(
        "--keep", help="keep the runs (logs, outputs, results) here; a run done there is not rerun"
    )
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="overrides for every run, e.g. launch.base_model.threads=1")  # fmt: skip
    ap.add_argument("--bound", type=float, default=mismatch.DEFAULT_BOUND,
                    help="a step's worst token above this counts (default %(default)s)")  # fmt: skip
    ap.add_argument("--json", help="also write the table's figures here")
    ap.add_argument("--runs", nargs="+", metavar="NAME=PATH", help="only the table, of these run folders")
    a = ap.parse_args(argv)
    named = parse_runs(a.runs) if a.runs else measure(a)
    if named:
        print_table(named, a)
    return 0


if __name__ == "__main__":
    run_cli(main)
