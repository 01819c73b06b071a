"""`make bootstrap` from a fresh clone, cold and warm, and the locked install by uv against pip.

    python3 bench/bench_bootstrap.py [--profile cpu] [--skip-pip]

1. Fresh clone, empty pip/uv/source caches (XDG_CACHE_HOME, PIP_CACHE_DIR, UV_CACHE_DIR and
   ASCEND_R1_CACHE in a new folder): `make bootstrap`, with its split into sources, installs, patching.
2. Another fresh clone, the same (now warm) caches.
3. The same lock installed into a new venv side by side: `uv pip sync --require-hashes` against
   `pip install --require-hashes --no-deps` (the pip path bootstrap used before the locks), each with an
   empty cache. Prints the ratio.
Targets: cold <= 60 s, warm <= 20 s on the 2-core machine. Note the load (uptime) with the result.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools.env import lock, pipconf  # noqa: E402


def caches(root: Path) -> dict[str, str]:
    return {
        "XDG_CACHE_HOME": str(root),
        "PIP_CACHE_DIR": str(root / "pip"),
        "UV_CACHE_DIR": str(root / "uv"),
        "ASCEND_R1_CACHE": str(root / "ascend-r1"),
        "CI": "true",
    }


def bootstrap(work: Path, name: str, env: dict[str, str], profile: str) -> tuple[float, str]:
    clone = work / name
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    start = time.monotonic()
    proc = subprocess.run(
        ["make", "bootstrap", f"PROFILE={profile}"], cwd=clone, env={**os.environ, **env},
        capture_output=True, text=True,
    )  # fmt: skip
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"{name}: make bootstrap failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    m = re.search(r"bootstrap done in .*", proc.stdout)
    return wall, m[0] if m else "?"


def timed_install(cmd: list[str], env: dict[str, str]) -> float:
    start = time.monotonic()
    proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{cmd[0]} failed:\n{proc.stderr[-3000:]}")
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", default="cpu", choices=lock.PROFILES)
    parser.add_argument("--skip-pip", action="store_true", help="skip the uv-vs-pip comparison")
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} cores)")
    with tempfile.TemporaryDirectory(prefix="bench-bootstrap-") as tmp:
        work = Path(tmp)
        env = caches(work / "cache")
        cold, cold_split = bootstrap(work, "cold", env, args.profile)
        warm, warm_split = bootstrap(work, "warm", env, args.profile)
        print(f"fresh clone, empty caches: {cold:6.1f} s   ({cold_split})   target <= 60 s")
        print(f"fresh clone, warm caches:  {warm:6.1f} s   ({warm_split})   target <= 20 s")
        if args.skip_pip:
            return
        spec = lock.SPECS[args.profile]
        settings = pipconf.read()
        uv = lock.ensure_uv()
        for name in ("uv", "pip"):
            subprocess.run([sys.executable, "-m", "venv", str(work / f"venv-{name}")], check=True)
        uv_s = timed_install(
            [str(uv), "pip", "sync", "-q", "--require-hashes", "--python", str(work / "venv-uv/bin/python"),
             "--build-constraints", str(REPO / lock.SPECS["build"].path), *settings.uv_args(find_links=spec.find_links),
             str(REPO / spec.path)],
            {**settings.uv_env(), "UV_CACHE_DIR": str(work / "uv-empty")},
        )  # fmt: skip
        pip_s = timed_install(
            [str(work / "venv-pip/bin/python"), "-m", "pip", "install", "-q", "--require-hashes", "--no-deps",
             "-r", str(REPO / spec.path)],
            {"PIP_CACHE_DIR": str(work / "pip-empty")},
        )  # fmt: skip
        print(
            f"locked install, empty cache: uv {uv_s:.1f} s, pip {pip_s:.1f} s: uv is {pip_s / uv_s:.1f}x faster"
        )
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
