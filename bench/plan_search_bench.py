"""Wall time of the layout search, `make plan RECIPE=deepseek-v3-671b-a3 SEARCH=1` (128 A3 = 256 ranks), as
a fresh process, against its 10 s target. Prints each run, the search's own summary line and the ratio
median / target.

    .venv-current-cpu/bin/python bench/plan_search_bench.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 10.0


def main(runs: int = 3) -> int:
    times, summary = [], ""
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "tools.launch", "plan", "deepseek-v3-671b-a3", "--search"],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        times.append(time.perf_counter() - t0)
        found = [ln for ln in proc.stdout.splitlines() if "searched" in ln]
        summary = found[0].strip() if found else (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    med = statistics.median(times)
    print(f"make plan deepseek-v3-671b-a3 SEARCH=1 (fresh process): {', '.join(f'{t:.2f}' for t in times)} s")
    print(f"search: {summary}")
    print(f"median {med:.2f} s; target {TARGET_S:.0f} s; ratio median/target = {med / TARGET_S:.2f}")
    return 0 if med < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
