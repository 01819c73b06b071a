"""`make train` on this machine: wall time, step time and peak memory of the default run, of the second
backend and of the parallel layout, side by side.

    python bench/bench_train.py [--recipes tiny-cpu tiny-cpu-fsdp tiny-cpu-parallel] [--steps 3]
                                                                            (make bench-train)

For each recipe: one fresh `python -m tools.launch.train` (outputs in a temporary folder, the tiny
assets made beforehand: build/tiny, build/tiny-parallel; on current build/tiny-current,
build/tiny-parallel-current), timed from the launcher's start to its exit, with the whole process tree (launcher, verl's driver, Ray's GCS/raylet/workers, the forked
checkpoint writers) sampled with psutil (tools/launch/process_tree.py: RSS every 0.2 s, PSS every 1 s) for the peak of the summed RSS and of the summed
PSS. The RSS sum counts a shared page once per process that maps it (torch's libraries in each of the ~10
Python processes, the copy-on-write pages of megatron-core's forked checkpoint writers); the PSS sum
splits each shared page between its sharers: it is the tree's actual use of RAM. Both are printed
against the memory target.

Targets, printed as ratios: on `published` 3 GRPO steps including Ray start-up in at most 90 s
wall and the process tree's peak resident memory at most 4 GiB; on `current` (a real vLLM engine
as the rollout, in its own server processes) 150 s and 6 GiB. On `current` also: the vLLM server's
start (its actor's first line until verl's rollout is up), and the rollout's throughput (response tokens
/ generation seconds, steps after the first) against the same engine generating alone (vLLM in one
process, the recipe's engine arguments, the same number of prompts, samples and response tokens).
Also printed: the time to Ray being up, worker start
and validation before training, each step's split (generation, reshard, reward, old log-prob, ref,
update), the first step's warm-up (step 1 minus the mean of the later steps), and the machine's load
(other jobs share the 2 cores: the figures are only comparable at a similar load).

tiny-cpu-parallel (4 gloo ranks, Megatron PP2 x EP2 on a 4-layer, 8-expert model; on current the rollout
is vLLM TP2 with expert parallelism in 2 replicas) is reported next to tiny-cpu (one rank, 2 layers, 4
experts on published, 3 layers, 8 experts on current): the ratio of its step time and peak memory, which phase of
the step dominates, and which processes hold the peak. Reported, not a target: 4 ranks on 2 cores
time-share the cores, so the parallel run measures the cost of the layout's machinery (pipeline
exchanges, expert all-to-all, gathering every stage's and expert rank's weights for the rollout), not
a speed-up.
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
sys.path.insert(0, str(REPO))  # run as a script (make bench-train): the checkout's tools

from tools import stacks  # noqa: E402
from tools.launch.process_tree import sampled  # noqa: E402

# (wall s, peak RSS GiB) for 3 steps of the stack's default run
TARGETS = {"published": (90.0, 4.0), "current": (150.0, 6.0)}
DEFAULT_RECIPES = {
    "published": ["tiny-cpu", "tiny-cpu-fsdp", "tiny-cpu-parallel"],
    "current": ["tiny-cpu", "tiny-cpu-parallel"],
}
SPLIT = [
    ("gen", "gen"),
    ("reshard", "reshard"),
    ("reward", "timing_s/reward"),
    ("old_lp", "timing_s/old_log_prob"),
    ("ref", "timing_s/ref"),
    ("update", "timing_s/update_actor"),
    ("step", "timing_s/step"),
]


def rollout_tokens_per_s(train: list[dict]) -> float | None:
    """Response tokens per second of generation in the steps after the first, from verl's metrics (the
    run's metrics.jsonl train rows)."""
    tokens = seconds = 0.0
    for m in (r["metrics"] for r in train[1:]):  # sequences = all tokens / (prompt + response) per sequence
        per_sequence = m["prompt_length/mean"] + m["response_length/mean"]
        tokens += m["response_length/mean"] * m["perf/total_num_tokens"] / per_sequence
        seconds += m["gen"]
    return tokens / seconds if seconds else None


ENGINE_ALONE = """
import json, sys, time
import pyarrow.parquet as pq
from vllm import LLM, SamplingParams
model, data, n, max_tokens, prompts, engine = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), json.loads(sys.argv[6])
rows = pq.read_table(data).to_pylist()[:prompts]
if __name__ == "__main__":
    llm = LLM(model=model, **engine)
    chats = [r["prompt"] for r in rows]
    params = SamplingParams(n=n, max_tokens=max_tokens, temperature=1.0, seed=0)
    llm.chat(chats, params, use_tqdm=False)  # warm-up, as the rollout's first step
    t0 = time.perf_counter()
    outs = llm.chat(chats, params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    print("ENGINE_ALONE " + json.dumps({"tokens": tokens, "seconds": seconds}))
"""


def engine_alone(run: Path) -> dict:
    """The recipe's vLLM engine generating alone, one process: the same prompts, samples and length."""
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    v = cfg["verl"]
    rollout = v["actor_rollout_ref"]["rollout"]
    engine = {
        "dtype": "bfloat16",
        "enforce_eager": rollout["enforce_eager"],
        "max_model_len": rollout["max_model_len"],
        "max_num_seqs": rollout.get("max_num_seqs", 8),
        "enable_prefix_caching": rollout["enable_prefix_caching"],
        **rollout.get("engine_kwargs", {}).get("vllm", {}),
    }
    argv = [v["actor_rollout_ref"]["model"]["path"], v["data"]["train_files"], str(rollout["n"]),
            str(v["data"]["max_response_length"]), str(v["data"]["train_batch_size"]), json.dumps(engine)]  # fmt: skip
    r = subprocess.run([sys.executable, "-c", ENGINE_ALONE, *argv], cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"the engine alone failed:\n{r.stderr[-3000:]}")
    out = json.loads(
        next(x for x in r.stdout.splitlines() if x.startswith("ENGINE_ALONE "))[len("ENGINE_ALONE ") :]
    )
    return {**out, "tokens_per_s": out["tokens"] / out["seconds"]}


def run_recipe(recipe: str, steps: int, outputs: Path) -> dict:
    env = {**os.environ, "ASCEND_R1_OUTPUTS": str(outputs)}
    cmd = [sys.executable, "-m", "tools.launch.train", "--recipe", recipe, "--fresh", "--run", f"bench-{recipe}",
           f"launch.steps={steps}"]  # fmt: skip
    load_before = os.getloadavg()
    t0 = time.time()
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    with sampled(proc.pid) as peak:
        out = proc.communicate()[0]
        wall = time.time() - t0
    if proc.returncode != 0:
        sys.stderr.write(out[-4000:])
        raise SystemExit(f"{recipe}: make train failed with status {proc.returncode}")
    run = outputs / stacks.resolve().name / f"bench-{recipe}"
    timeline = json.loads((run / "timeline.json").read_text())
    attempt = timeline[max(timeline, key=int)]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    result = {
        "recipe": recipe,
        "stack": stacks.resolve().name,
        "wall_s": wall,
        "peak_rss_gib": peak.get("rss", 0) / 2**30,
        "peak_pss_gib": peak.get("pss", 0) / 2**30,
        "launcher_peak_rss_gib": attempt["peak_rss_tree_bytes"] / 2**30,
        "procs": peak.get("procs", 0),
        "timeline": attempt,
        "steps": [{k: r["metrics"].get(m) for k, m in SPLIT} for r in train],
        # the engine against the actor on the same weights, every step (verl's rollout-vs-actor figure: max
        # |p_vLLM - p_actor| over the sampled tokens; present when the rollout returns log-probs)
        "rollout_probs_diff_max": [r["metrics"].get("training/rollout_probs_diff_max") for r in train],
        "load": (load_before, os.getloadavg()),
    }
    if "rollout_up" in attempt:  # a vLLM rollout: its throughput against the engine alone, at the same load
        result["rollout_tokens_per_s"] = rollout_tokens_per_s(train)
        result["engine_alone"] = engine_alone(run)
    return result


def report(r: dict) -> None:
    t = r["timeline"]
    steps = r["steps"]
    print(
        f"\n== recipe {r['recipe']}  (load average before {r['load'][0][0]:.2f}, after {r['load'][1][0]:.2f})"
    )
    wall_target, rss_target = TARGETS[r["stack"]]
    print(
        f"wall, launcher start to exit (assets cached, Ray start, validation x2, {len(steps)} steps, checkpoint): "
        f"{r['wall_s']:.1f} s   ratio to the {wall_target:.0f} s target ({r['stack']}): {r['wall_s'] / wall_target:.2f}"
    )
    print(
        f"peak memory of the process tree: RSS {r['peak_rss_gib']:.2f} GiB (ratio to {rss_target:.0f} GiB: "
        f"{r['peak_rss_gib'] / rss_target:.2f}), PSS {r['peak_pss_gib']:.2f} GiB (ratio "
        f"{r['peak_pss_gib'] / rss_target:.2f}), up to {r['procs']} processes"
    )
    ray_init, ray_up, train0 = t.get("ray_init", 0.0), t.get("ray_up", 0.0), t.get("training_start", 0.0)
    last = max(float(v) for v in t["steps"].values())
    print(f"  imports and config until ray.init:           {ray_init:6.1f} s")
    print(f"  Ray start-up (ray.init until the driver task runs): {ray_up - ray_init:6.1f} s")
    if "rollout_up" in t:  # current: the Megatron workers, then vLLM's server processes
        print(f"  Megatron actor + reference workers up:              {t['workers_up'] - ray_up:6.1f} s")
        print(
            f"  vLLM server start (engine up, agent loop ready):    {t['rollout_up'] - t['rollout_start']:6.1f} s"
        )
        print(f"  validation before training:                         {train0 - t['rollout_up']:6.1f} s")
    else:
        print(f"  workers, model load, validation before training:    {train0 - ray_up:6.1f} s")
    print(
        f"  training steps (+ end validation, checkpoint):       {last - train0:6.1f} s to the last step line"
    )
    print("  step  " + " ".join(f"{k:>8}" for k, _ in SPLIT))
    for i, s in enumerate(steps, 1):
        print(f"  {i:>4}  " + " ".join(f"{(s[k] or 0):8.2f}" for k, _ in SPLIT))
    if len(steps) > 1:
        rest = sum(s["step"] for s in steps[1:]) / (len(steps) - 1)
        print(
            f"  first step warm-up: {steps[0]['step'] - rest:.2f} s (step 1 {steps[0]['step']:.2f} s, later mean {rest:.2f} s)"
        )
    if any(x is not None for x in r.get("rollout_probs_diff_max", [])):
        diffs = ", ".join("-" if x is None else f"{x:.2g}" for x in r["rollout_probs_diff_max"])
        print(
            f"  the engine against the actor (max |p_vLLM - p_actor| of the sampled tokens), by step: {diffs}"
        )
    if "engine_alone" in r:
        alone = r["engine_alone"]
        print(
            f"  rollout throughput (steps after the first): {r['rollout_tokens_per_s']:.1f} response tokens/s; "
            f"the same engine alone: {alone['tokens_per_s']:.1f} tokens/s ({alone['tokens']} tokens in "
            f"{alone['seconds']:.2f} s); ratio {r['rollout_tokens_per_s'] / alone['tokens_per_s']:.2f}"
        )
    print("  peak memory by process (launcher's sample at the peak):")
    for kind, gib, n in peak_by_kind(r)[:6]:
        print(f"    {gib:6.2f} GiB  {n} x {kind}")


def later_steps(r: dict) -> dict[str, float]:
    """Mean of each phase over the steps after the first (the first carries the warm-up)."""
    steps = r["steps"][1:] or r["steps"]
    return {k: sum((s[k] or 0.0) for s in steps) / len(steps) for k, _ in SPLIT}


def peak_by_kind(r: dict) -> list[tuple[str, float, int]]:
    """(process kind, GiB, count) at the sampled peak, largest first (Ray's process titles)."""
    kinds: dict[str, list[int]] = {}
    for name, rss in r["timeline"].get("peak_rss_by_process", []):
        kind = name.split(".")[0] if name.startswith("ray::WorkerDict") else name
        kinds.setdefault(kind, []).append(rss)
    return sorted(((k, sum(v) / 2**30, len(v)) for k, v in kinds.items()), key=lambda x: -x[1])


def compare(base: dict, other: dict) -> None:
    """The parallel (or any) recipe next to the single-rank one: ratios and what dominates."""
    b, o = later_steps(base), later_steps(other)
    print(f"\n== {other['recipe']} next to {base['recipe']} (steps after the first, mean)")
    print(f"  {'phase':>8} {base['recipe']:>18} {other['recipe']:>18} {'ratio':>7}")
    for k, _ in SPLIT:
        ratio = o[k] / b[k] if b[k] else float("nan")
        print(f"  {k:>8} {b[k]:>17.2f}s {o[k]:>17.2f}s {ratio:>7.2f}")
    print(
        f"  {'wall':>8} {base['wall_s']:>17.1f}s {other['wall_s']:>17.1f}s {other['wall_s'] / base['wall_s']:>7.2f}"
    )
    print(
        f"  {'peak RSS':>8} {base['peak_rss_gib']:>15.2f}GiB {other['peak_rss_gib']:>15.2f}GiB "
        f"{other['peak_rss_gib'] / base['peak_rss_gib']:>7.2f}"
    )
    parts = {k: v for k, v in o.items() if k != "step"}
    top = max(parts, key=parts.get)
    print(
        f"  dominates the {other['recipe']} step: {top} ({parts[top]:.2f} s of {o['step']:.2f} s, "
        f"{parts[top] / o['step']:.0%}); {base['recipe']}: {max((k for k in b if k != 'step'), key=b.get)}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", nargs="+", help="default: the stack's (DEFAULT_RECIPES)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    a.recipes = a.recipes or DEFAULT_RECIPES[stacks.resolve().name]
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()}")
    results = []
    for recipe in a.recipes:  # the tiny model, data and checkpoint exist before anything is timed
        subprocess.run([sys.executable, "-m", "tools.miniature.assets", recipe], cwd=REPO, check=True)
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        for recipe in a.recipes:
            r = run_recipe(recipe, a.steps, Path(tmp))
            report(r)
            results.append(r)
    by_name = {r["recipe"]: r for r in results}
    if "tiny-cpu" in by_name:
        for r in results:
            if r["recipe"] not in ("tiny-cpu", "tiny-cpu-fsdp"):
                compare(by_name["tiny-cpu"], r)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
