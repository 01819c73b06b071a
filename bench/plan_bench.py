"""Wall time of the preflight planner for the 671B recipe, as `make plan` runs it (a fresh process), against
the planner's 2 s target. Prints each run and the ratio median / target."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 2.0


def main(runs: int = 5) -> int:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "tools.launch", "plan", "deepseek-v3-671b-a3"],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        times.append(time.perf_counter() - t0)
        last = proc.stdout.strip().splitlines()[-1] if proc.stdout else proc.stderr
    med = statistics.median(times)
    print(
        f"make plan deepseek-v3-671b-a3 (fresh process, machine checks on): {', '.join(f'{t:.2f}' for t in times)} s"
    )
    print(f"planner's own line: {last}")
    print(f"median {med:.2f} s; target {TARGET_S:.1f} s; ratio median/target = {med / TARGET_S:.2f}")
    return 0 if med < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
