"""The CPU run that learns (recipe tiny-learn), for two seeds: how far held-out accuracy rises, how long it
takes, how much memory it needs.

    python bench/bench_learn.py [--seeds 0 1] [--steps N] [--json out.json]      (make bench-learn)
    python bench/bench_learn.py --modes sync separate_async                        (make bench-learn-async)

For each seed, in a temporary folder (a fresh base-model cache, ASCEND_R1_LEARN; outputs in
ASCEND_R1_OUTPUTS), two timed processes, each with its whole process tree sampled (tools/launch/process_tree.py:
summed RSS every 0.2 s, and PSS, which splits a shared page between its sharers, every 1 s):
  1. `python -m tools.miniature.assets tiny-learn launch.seed=S`: the problems through tools.data, the base
     model pre-trained and scored (base_model.json), its Megatron checkpoint (hf-to-mcore);
  2. `python -m tools.launch.train --recipe tiny-learn --fresh launch.seed=S`: GRPO through verl (Ray,
     Megatron actor on gloo; the rollout of the stack: HF on published, the vLLM engine in its own server
     process on current), validation every 10 steps, a checkpoint at the end, then the final evaluation (the
     actor exported to HF and scored as the base model was). The recipe's steps (40; 30 on current) and
     validation interval unless --steps says otherwise.

With --modes, each seed's base model is made once and GRPO runs once per trainer mode (recipes/mode,
docs/async.md) on it, one after the other: the held-out accuracy rise, the staleness verl measured
(`training/off_policy/trajectory_staleness/max`) and the step time side by side, mode against sync on the
same cores and seed (the async modes' target: the same rise within the seeds' noise).

The stack is the environment's (`STACK=current make bench-learn`, or `make bench-learn` for the default).

Targets, printed as ratios: validation accuracy (mean over 8 samples per held-out problem) at
least 0.30 above the base model's sampled accuracy within 40 GRPO steps, for every seed; the whole run
(1 + 2) at most 600 s; the GRPO part (2 without the final evaluation) at most 300 s. The machine's load
is printed before and after each process: other jobs share the cores, and the times are only comparable
at a similar load (CPU seconds of the base model's pre-training are printed too: they do not depend on it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script (make bench-learn): the checkout's tools

from tools.launch.process_tree import sampled  # noqa: E402

RISE_TARGET = 0.30
WHOLE_TARGET_S = 600.0
GRPO_TARGET_S = 300.0
MAX_STEPS = 40
STALENESS = "training/off_policy/trajectory_staleness/max"  # verl 0.9.1's V1 trainer, every mode


def timed(cmd: list[str], env: dict[str, str], log: Path) -> dict:
    load = os.getloadavg()[0]
    t0 = time.time()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, text=True)
        with sampled(proc.pid) as peak:
            rc = proc.wait()
    wall = time.time() - t0
    if rc != 0:
        sys.stderr.write(log.read_text()[-4000:])
        raise SystemExit(f"{' '.join(cmd[2:5])}: exit {rc} (log {log})")
    return {"wall_s": wall, "rss_gib": peak.get("rss", 0) / 2**30, "pss_gib": peak.get("pss", 0) / 2**30,
            "load": (load, os.getloadavg()[0])}  # fmt: skip


def run_seed(
    seed: int, steps: int | None, tmp: Path, cache: Path | None = None, mode: str | None = None
) -> dict:
    learn = cache or tmp / "build"
    env = {**os.environ, "ASCEND_R1_LEARN": str(learn), "ASCEND_R1_OUTPUTS": str(tmp / "outputs")}
    sets = [f"launch.seed={seed}", *([f"launch.steps={steps}"] if steps else [])]
    base = timed(
        [sys.executable, "-m", "tools.miniature.assets", "tiny-learn", *sets], env, tmp / f"assets-{seed}.log"
    )
    made = "making the base model" in (tmp / f"assets-{seed}.log").read_text()
    base["cached"] = not made
    run_name = f"bench-learn-s{seed}" + (f"-{mode}" if mode else "")
    train_log = tmp / f"train-{seed}{'-' + mode if mode else ''}.log"
    train = timed(
        [sys.executable, "-m", "tools.launch.train", "--recipe", "tiny-learn", "--fresh", "--run", run_name, *sets,
         *([f"mode={mode}"] if mode else [])],
        env, train_log,
    )  # fmt: skip
    run = next((tmp / "outputs").glob(f"*/{run_name}"))  # outputs/<stack>/<run>
    out = train_log.read_text()
    final_s = 0.0
    for line in out.splitlines():  # "  (NN s)" after "final evaluation: ..."
        if line.strip().startswith("(") and line.strip().endswith(" s)"):
            final_s = float(line.strip()[1:-3])
    timeline = json.loads((run / "timeline.json").read_text())
    attempt = timeline[max(timeline, key=int)]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    step_s = [r["metrics"]["timing_s/step"] for r in rows if r["kind"] == "train"]
    # a validation's time: the gap between the step lines before and after it less the step's own time
    at = {int(k): v for k, v in attempt.get("steps", {}).items()}
    timed_steps = {r["step"]: r["metrics"]["timing_s/step"] for r in rows if r["kind"] == "train"}
    val_s = [
        at[s] - at[s - 1] - timed_steps[s]
        for s in sorted(int(k) for k in attempt.get("validations", {}))
        if s - 1 in at and s in at and s in timed_steps
    ]
    staleness = [r["metrics"][STALENESS] for r in rows if r["kind"] == "train" and STALENESS in r["metrics"]]
    return {
        "seed": seed,
        "mode": mode or "sync",
        "staleness_max": max(staleness) if staleness else None,
        "base": json.loads((run / "base_model.json").read_text()),
        "assets": base,
        "train": train,
        "final_eval_s": final_s,
        "verl": {k: attempt.get(k) for k in ("ray_init", "ray_up", "training_start", "end")},
        "step_s": step_s,
        "validation_s": val_s,
        "learning": json.loads((run / "learning.json").read_text()),
    }


def report(r: dict) -> None:
    b, lr, t, a = r["base"], r["learning"], r["train"], r["assets"]
    h = b["held_out"]
    grpo = t["wall_s"] - r["final_eval_s"]
    # a cached base model (--cache): its recorded making time stands in for the assets process's
    whole = (a["wall_s"] if not a["cached"] else a["wall_s"] + b["made_in_seconds"]) + t["wall_s"]
    print(f"\n== seed {r['seed']}, mode {r['mode']}")
    print(
        f"base model: pre-trained in {b['pretrain_seconds']:.0f} s ({b['pretrain_cpu_seconds']:.0f} s CPU); held-out "
        f"greedy {h['greedy_acc']:.3f}, sampled {h['sampled_acc']:.3f} ({h['samples_per_problem']} a problem), "
        f"format {h['sampled_format']:.2f}; "
        + (
            f"cached (made in {b['made_in_seconds']:.0f} s when it was made; this assets process {a['wall_s']:.0f} s)"
            if a["cached"]
            else f"assets process {a['wall_s']:.0f} s wall, peak RSS {a['rss_gib']:.2f} GiB"
        )
        + f" (load {a['load'][0]:.1f} -> {a['load'][1]:.1f})"
    )
    val = " ".join(f"{k}:{v:.3f}" for k, v in lr["validation"].items())
    print(f"validation accuracy by step: {val}")
    steps_to = next(
        (int(k) for k, v in lr["validation"].items() if v - h["sampled_acc"] >= RISE_TARGET), None
    )
    print(
        f"rise over the base model's sampled accuracy (last validation): {lr['rise_over_base']:+.3f} "
        f"(target >= {RISE_TARGET} within {MAX_STEPS} steps: {'reached at step ' + str(steps_to) if steps_to is not None else 'NOT reached'})"
    )
    print(
        f"training reward, mean of the first 5 steps -> last 5: {lr['reward_first5']:.3f} -> {lr['reward_last5']:.3f}"
    )
    if lr.get("final_greedy_acc") is not None:
        print(
            f"trained actor (exported, transformers): greedy {h['greedy_acc']:.3f} -> {lr['final_greedy_acc']:.3f}, "
            f"sampled {h['sampled_acc']:.3f} -> {lr['final_sampled_acc']:.3f}"
        )
    v = r["verl"]
    steps = r["step_s"]
    later = steps[1:] or steps
    print(
        f"GRPO process: {t['wall_s']:.0f} s wall incl. final evaluation {r['final_eval_s']:.0f} s -> GRPO part "
        f"{grpo:.0f} s (ratio to {GRPO_TARGET_S:.0f} s: {grpo / GRPO_TARGET_S:.2f}); verl: ray.init at "
        f"{v['ray_init'] or 0:.0f} s, Ray up {v['ray_up'] or 0:.0f} s, training from {v['training_start'] or 0:.0f} s, "
        f"exit {v['end'] or 0:.0f} s; {len(steps)} steps, {sum(later) / len(later):.1f} s a step after the first "
        f"(first {steps[0]:.1f} s) (load {t['load'][0]:.1f} -> {t['load'][1]:.1f})"
    )
    if r.get("validation_s"):
        vs = r["validation_s"]
        print(
            f"validations after a step: {len(vs)}, {sum(vs) / len(vs):.1f} s each (the one before training not timed)"
        )
    print(
        f"whole run (base model + GRPO + final evaluation): {whole:.0f} s (ratio to {WHOLE_TARGET_S:.0f} s: "
        f"{whole / WHOLE_TARGET_S:.2f}); peak memory of the GRPO process tree: RSS {t['rss_gib']:.2f} GiB, "
        f"PSS {t['pss_gib']:.2f} GiB"
    )


def mode_table(results: list[dict]) -> list[str]:
    """The modes side by side: per seed and mode, the rise over the base model (last validation), the last validation,
    the staleness verl measured and the median step time; then each async mode's rise less sync's."""
    out = [
        "| seed | mode | rise (last) | last validation | staleness max | step s (median, after the first) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lr, steps = r["learning"], sorted(r["step_s"][1:] or r["step_s"])
        last = list(lr["validation"].values())[-1]
        stale = "-" if r["staleness_max"] is None else f"{r['staleness_max']:.0f}"
        out.append(
            f"| {r['seed']} | {r['mode']} | {lr['rise_over_base']:+.3f} | {last:.3f} | {stale} | "
            f"{steps[len(steps) // 2]:.2f} |"
        )
    sync = {r["seed"]: r["learning"]["rise_over_base"] for r in results if r["mode"] == "sync"}
    for r in results:
        if r["mode"] != "sync" and r["seed"] in sync:
            d = r["learning"]["rise_over_base"] - sync[r["seed"]]
            out.append(f"seed {r['seed']}: {r['mode']} rise {d:+.3f} against sync's on the same base model")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the recipe's)")
    ap.add_argument(
        "--modes",
        nargs="+",
        help="trainer modes to run on each seed's base model, side by side (sync colocate_async separate_async; "
        "the current stack)",
    )
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--keep", help="keep the runs (logs, outputs, base models) in this folder")
    ap.add_argument(
        "--cache",
        help="base models from (and into) this folder (ASCEND_R1_LEARN) instead of a fresh one; a cached "
        "model's recorded making time counts in the whole-run figure",
    )
    a = ap.parse_args()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()}")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-learn-") as tmp_name:
        tmp = Path(a.keep) if a.keep else Path(tmp_name)
        tmp.mkdir(parents=True, exist_ok=True)
        for seed in a.seeds:
            for mode in a.modes or [None]:
                r = run_seed(seed, a.steps, tmp, Path(a.cache).resolve() if a.cache else None, mode)
                report(r)
                results.append(r)
    ok = all(r["learning"]["rise_over_base"] >= RISE_TARGET for r in results)
    print(f"\nall runs rise >= {RISE_TARGET}: {'yes' if ok else 'NO'}")
    if a.modes:
        print("\n" + "\n".join(mode_table(results)))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
