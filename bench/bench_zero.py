"""R1-Zero in miniature (recipe tiny-zero): the main run on two seeds and its three controls, side by side, with
the figures R1-Zero's mechanism is judged by (tools/analysis/reasoning.py) and where the time went.

    python bench/bench_zero.py [--runs main-0 main-1 no-edge-0 no-pay-0 dr-grpo-0] [--cache build/zero] [--keep DIR]
                                                                              (make bench-zero)

Each run is two timed processes with their whole process tree sampled (tools/launch/process_tree.py):
  1. `python -m tools.miniature.assets tiny-zero launch.seed=S ...`: the problems, the base model pre-trained
     and checked (base_model.json, its gates), its Megatron checkpoint (cached in --cache when given);
  2. `python -m tools.launch.train --recipe tiny-zero --fresh ...`: GRPO through verl (Ray, Megatron actor on
     gloo, the vLLM engine in its own server process), validation every 16 steps (the recipe's
     verl.trainer.test_freq), the final evaluation.
The runs:
  main-S      the recipe as it is, seed S
  no-edge-S   the control where the trace gives no accuracy edge: GRPO on one-digit problems
              (launch.task.train_max_digits=1), whose direct answer the base model knows; its length must not
              grow (x1.15 at most)
  no-pay-S    the control where nothing pays: the reward is 1 for any closed answer, right or wrong
              (launch.reward=compute_score_long_addition_blind); its length must not grow (x1.15 at most) nor its
              trace rate rise (+0.1 at most)
  dr-grpo-S   the main run with Dr. GRPO's settings (loss_agg_mode=seq-mean-token-sum-norm, no std
              normalisation of the advantages, no KL loss): length and accuracy must still rise together

Target of time: the RL part of a run (2, less the final evaluation) within 1800 s on 2 cores. The machine's
load is printed beside every time: other jobs share the cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script (make bench-zero): the checkout's tools

from bench.bench_learn import timed  # noqa: E402
from tools.analysis import reasoning  # noqa: E402
from tools.report import runs  # noqa: E402

RL_TARGET_S = 1800.0
VARIANTS = {
    "main": [],
    # one-digit sums: the direct answer is as right as the trace (84 training problems: 16 epochs for 80 steps)
    "no-edge": ["launch.task.train_max_digits=1", "verl.trainer.total_epochs=16"],
    # a reward blind to the sum (any closed answer pays, in either format): nothing the trace does pays
    "no-pay": [f"launch.reward={reasoning.BLIND_REWARD}"],
    "dr-grpo": [
        "verl.actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
        "verl.algorithm.norm_adv_by_std_in_grpo=false",
        "verl.actor_rollout_ref.actor.use_kl_loss=false",
    ],
}


def run_one(name: str, tmp: Path, cache: Path, steps: int | None, extra: Sequence[str] = ()) -> dict:
    """One run of the recipe (`name`: <variant>-<seed>) under `tmp`, `extra` overrides after the variant's
    (bench/bench_routing.py: the correction)."""
    variant, seed = name.rsplit("-", 1)
    sets = [f"launch.seed={seed}", *VARIANTS[variant], *([f"launch.steps={steps}"] if steps else []), *extra]
    env = {**os.environ, "ASCEND_R1_ZERO": str(cache), "ASCEND_R1_OUTPUTS": str(tmp / "outputs")}
    assets = timed(
        [sys.executable, "-m", "tools.miniature.assets", "tiny-zero", *sets], env, tmp / f"assets-{name}.log"
    )
    train = timed(
        [sys.executable, "-m", "tools.launch.train", "--recipe", "tiny-zero", "--fresh", "--run", f"zero-{name}", *sets],
        env, tmp / f"train-{name}.log",
    )  # fmt: skip
    folder = next((tmp / "outputs").glob(f"*/zero-{name}"))
    log = (tmp / f"train-{name}.log").read_text()
    final_s = next(
        (
            float(x.strip()[1:-3])
            for x in log.splitlines()
            if x.strip().startswith("(") and x.strip().endswith(" s)")
        ),
        0.0,
    )
    timeline = json.loads((folder / "timeline.json").read_text())
    attempt = timeline[max(timeline, key=int)]
    run = runs.read(folder)
    pic = reasoning.picture(run)
    fig = reasoning.figures(pic)
    kind = reasoning.kind_of(run.config)  # main, no-edge, no-pay or dr-grpo: the bounds the run answers to
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    phases = {}
    for r in rows:
        if r["kind"] == "train":
            for k, v in r["metrics"].items():
                if k.startswith("timing_s/") and isinstance(v, int | float):
                    phases.setdefault(k, []).append(v)
    return {
        "name": name,
        "kind": kind,
        "folder": str(folder),
        "base": json.loads((folder / "base_model.json").read_text()),
        "assets": assets,
        "train": train,
        "final_eval_s": final_s,
        "training_start_s": attempt.get("training_start"),
        "phases_mean_s": {k: sum(v) / len(v) for k, v in phases.items()},
        "figures": fig,
        "edge": reasoning.edge_line(pic),
        "checks": [c.__dict__ for c in reasoning.checks(fig, kind)],
    }


def report(r: dict) -> None:
    t, h = r["train"], r["base"]["held_out"]
    rl = t["wall_s"] - r["final_eval_s"]
    print(f"\n== {r['name']} ({r['folder']})")
    gates = "; ".join(
        f"{g['what']} {g['value']} ({'met' if g['met'] else 'NOT met'})" for g in h["gates"].values()
    )
    print(f"base model: {gates}; pre-trained in {r['base']['pretrain_seconds']:.0f} s "
          f"({r['base']['pretrain_cpu_seconds']:.0f} s CPU)")  # fmt: skip
    if r.get("edge"):
        print("  " + r["edge"])
    for c in r["checks"]:
        print("  " + reasoning.Check(**c).line())
    f = r["figures"]
    print(f"  length {f['length_first5']:.1f} -> {f['length_last10']:.1f}; trace {f['trace_first5']:.2f} -> "
          f"{f['trace_last10']:.2f}; hard sampled {f['sampled_hard_first']:.2f} -> {f['sampled_hard_last']:.2f}, "
          f"greedy {f['greedy_hard_before']:.2f} -> {f['greedy_hard_after']:.2f}")  # fmt: skip
    steps = f["steps"]
    phases = ", ".join(
        f"{k.split('/', 1)[1]} {v:.2f}"
        for k, v in sorted(r["phases_mean_s"].items(), key=lambda x: -x[1])[:8]
    )
    print(f"RL part: {rl:.0f} s (ratio to {RL_TARGET_S:.0f} s: {rl / RL_TARGET_S:.2f}), {steps} steps, training from "
          f"{r['training_start_s'] or math.nan:.0f} s; a step on average: {phases} (load {t['load'][0]:.1f} -> "
          f"{t['load'][1]:.1f}); final evaluation {r['final_eval_s']:.0f} s; peak PSS {t['pss_gib']:.2f} GiB")  # fmt: skip


WINDOWS = ((1, 5), (6, 20), (21, 40), (41, 60), (61, 80))  # docs/r1-zero.md's no-edge table


def window_lines(run: runs.Run) -> list[str]:
    """The figures docs/r1-zero.md gives per window of training steps (the traced and the direct responses'
    accuracy, the trace rate, the mean length: the reward tally and verl's response_length/mean), the
    held-out accuracy of each bucket at each validation, and where a step's time went (verl's timing_s/*)."""

    def mean(key: str, lo: int, hi: int) -> str:
        xs = [m[key] for s, m in run.steps.items() if lo <= s <= hi and isinstance(m.get(key), int | float)]
        return f"{sum(xs) / len(xs):.3f}" if xs else "-"

    with_trace, without_trace = reasoning.tally.split_keys("trace")
    out = [
        "| steps | traced responses right | direct responses right | trace rate | mean length |",
        "|---|---|---|---|---|",
    ]
    for lo, hi in WINDOWS:
        if any(lo <= s <= hi for s in run.steps):
            cells = [
                mean(k, lo, hi) for k in (with_trace, without_trace, "reward/trace", "response_length/mean")
            ]
            out.append(f"| {lo}-{hi} | " + " | ".join(cells) + " |")
    pic = reasoning.picture(run)
    if pic is not None:
        for step in pic.val_steps:
            accs = " / ".join(f"{pic.acc[b][step]:.2f}" for b in pic.buckets if step in pic.acc[b])
            out.append(f"held-out accuracy at step {step}, digits {pic.buckets}: {accs}")
    phases: dict[str, list[float]] = {}
    for m in run.steps.values():
        for k, v in m.items():
            if k.startswith("timing_s/") and isinstance(v, int | float):
                phases.setdefault(k, []).append(v)
    if phases:
        means = sorted(((sum(v) / len(v), k) for k, v in phases.items()), reverse=True)[:8]
        out.append("a step on average: " + ", ".join(f"{k.split('/', 1)[1]} {v:.2f} s" for v, k in means))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", nargs="+", default=["main-0", "main-1", "no-edge-0", "no-pay-0", "dr-grpo-0"])
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the recipe's)")
    ap.add_argument("--cache", help="base models from (and into) this folder (ASCEND_R1_ZERO)")
    ap.add_argument("--keep", help="keep the runs (logs, outputs) in this folder")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument(
        "--report",
        nargs="+",
        metavar="RUN",
        help="only print the figures of these run folders (runs made before), with their windows",
    )
    a = ap.parse_args()
    if a.report:
        ok = True
        for folder in a.report:
            run = runs.read(Path(folder))
            pic = reasoning.picture(run)
            if pic is None:
                ap.error(f"{folder}: no validation of the long-addition buckets (a tiny-zero run folder?)")
            print(f"\n== {folder}")
            lines = reasoning.describe(pic, reasoning.kind_of(run.config))
            print("\n".join(lines))
            print("\n".join(window_lines(run)))
            ok = ok and not any(line.lstrip().startswith("MISS") for line in lines)
        return 0 if ok else 1
    for name in a.runs:
        if name.rsplit("-", 1)[0] not in VARIANTS or not name.rsplit("-", 1)[-1].isdigit():
            ap.error(f"--runs {name}: want <{'|'.join(VARIANTS)}>-<seed>, e.g. main-0")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()}")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-zero-") as tmp_name:
        tmp = Path(a.keep).resolve() if a.keep else Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        cache = Path(a.cache).resolve() if a.cache else tmp / "build"
        for name in a.runs:
            r = run_one(name, tmp, cache, a.steps)
            report(r)
            results.append(r)
            if a.json:
                Path(a.json).write_text(json.dumps(results, indent=1))
    ok = all(c["met"] for r in results for c in r["checks"])
    print(f"\nevery check of every run met: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
