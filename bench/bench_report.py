"""`make report` on a 200-step run against its 3 s target (synthetic metrics, real verl names).

    python bench/bench_report.py [--steps 200] [--repeat 3]

The run folder is made from a real one (tests/tools/report/data/run-tiny-cpu-parallel: verl 0.9.1's metrics of
tiny-cpu-parallel on current, its config.yaml, timeline.json and reward tally): each of the 200 steps is
the recorded step with its numbers varied (a drifting reward, KL, entropy...), with validations every 10
steps, and a reward tally for every step. Timed: `make report RUN=<run>` as a user runs it (a fresh
interpreter: imports included, with make's bytecode cache, which the first run fills), best and median of
--repeat runs; and, in one process, the parts (reading, the PNGs, the page).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SOURCE = ROOT / "tests" / "tools" / "launch" / "data" / "run-tiny-cpu-parallel"
TARGET_S = 3.0


def make_run(folder: Path, steps: int, seed: int = 0) -> Path:
    """A run folder with `steps` training steps shaped like SOURCE's."""
    rng = random.Random(seed)
    recs = [json.loads(x) for x in (SOURCE / "verl-metrics-1.jsonl").read_text().splitlines()]
    train = next(r["data"] for r in recs if "timing_s/step" in r["data"])
    val = next(r["data"] for r in recs if any(k.startswith("val-") for k in r["data"]))
    val = {k: v for k, v in val.items() if k.startswith("val-")}
    folder.mkdir(parents=True)
    for name in ("config.yaml", "command.txt", "timeline.json"):
        shutil.copy(SOURCE / name, folder / name)
    lines, tally = [], []
    per_step = 8  # config: 4 prompts x 2 responses
    for s in range(0, steps + 1):
        if s % 10 == 0:
            acc = min(1.0, 0.1 + s / steps * 0.6 + rng.uniform(-0.05, 0.05))
            lines.append({"step": s, "data": {k: (acc if "acc" in k else v) for k, v in val.items()}})
        if s == 0:
            continue
        d = {}
        for k, v in train.items():
            if isinstance(v, int | float):
                d[k] = v * (1 + rng.uniform(-0.2, 0.2)) if v else rng.uniform(0, 1e-3)
        prog = s / steps
        d["critic/score/mean"] = d["critic/rewards/mean"] = 0.1 + 0.6 * prog + rng.uniform(-0.05, 0.05)
        d["actor/kl_loss"] = 1e-3 * prog * (1 + rng.uniform(-0.1, 0.1))
        d["actor/entropy"] = 6.2 - 2 * prog + rng.uniform(-0.1, 0.1)
        d["response_length/clip_ratio"] = max(0.0, 0.8 - 0.5 * prog + rng.uniform(-0.05, 0.05))
        d["training/global_step"] = s
        lines.append({"step": s, "data": d})
        for _ in range(per_step):
            ok = rng.random() < 0.2 + 0.7 * prog
            right = ok and rng.random() < 0.5 + 0.4 * prog
            tally.append({"split": "train", "n": 1, "format": float(ok), "acc": float(right),
                          "timeouts": float(rng.random() < 0.01), "score": 0.33 * ok + 0.67 * right,
                          "seconds": 0.002})  # fmt: skip
    (folder / "verl-metrics-1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (folder / "reward-tally-1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in tally))
    ckpt = folder / "checkpoints" / f"global_step_{steps}"
    ckpt.mkdir(parents=True)
    (folder / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(str(steps))
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=4)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        run = make_run(Path(tmp) / "synthetic-200", a.steps)
        size = sum(p.stat().st_size for p in run.iterdir() if p.is_file())
        print(f"synthetic run: {a.steps} steps, {size / 1024:.0f} KiB of metrics and tally ({run})")
        walls, cpus = [], []
        for _ in range(a.repeat):
            t, used = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
            # as a user runs it: make sets the bytecode cache (build/pycache); the first run fills it
            r = subprocess.run(["make", "-s", "report", f"PY={sys.executable}", f"RUN={run}"], cwd=ROOT,
                               capture_output=True, text=True)  # fmt: skip
            walls.append(time.perf_counter() - t)
            now = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime)
            if r.returncode != 0:
                print(r.stdout[-2000:], r.stderr[-2000:])
                return 1
        load = os.getloadavg()[0]
        print(f"CPU time of the same runs (user + sys, make included): best {min(cpus):.2f} s; load average "
              f"{load:.1f} on {os.cpu_count()} cores (a loaded machine stretches the wall time, not this)")  # fmt: skip
        page = run / "report" / "report.html"
        pngs = sorted(p.name for p in (run / "report").glob("*.png"))
        best, med = min(walls), statistics.median(walls)
        print(f"make report (a fresh interpreter, imports included): best {best:.2f} s, median {med:.2f} s of "
              f"{a.repeat} (first {walls[0]:.2f} s); target {TARGET_S:.0f} s: ratio {best / TARGET_S:.2f}")  # fmt: skip
        print(f"page {page.stat().st_size / 1024:.0f} KiB with {len(pngs)} PNGs: {', '.join(pngs)}")

        # the parts, in this process (after a first warm-up call)
        from tools import report
        from tools.report import build, runs

        report.write(run, Path(tmp) / "warm")
        t0 = time.perf_counter()
        r_ = runs.read(run)
        t1 = time.perf_counter()
        built = build.build([r_], Path(tmp) / "parts")
        t2 = time.perf_counter()
        print(f"in one process: read {t1 - t0:.2f} s, rows + {len(built.images)} PNGs + page {t2 - t1:.2f} s")
        ok = best <= TARGET_S and not math.isnan(best)
        print("PASS" if ok else f"FAIL: over the {TARGET_S:.0f} s target")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
