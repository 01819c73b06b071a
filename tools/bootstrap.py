"""`make bootstrap`: pristine sources, the locked virtual environment for a profile, patches, patched packages.

Sources come first and need nothing but the standard library (no torch, no build). The environment is
`locks/<profile>.txt` installed exactly by uv (`uv pip sync --require-hashes`: nothing missing, nothing
extra). Idempotent: every step records what it did (lock digest, tree commit per installed package), so a
second run with nothing changed only checks and finishes in about a second.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tools import atomic
from tools.env import lock
from tools.errors import UserError
from tools.patches import git as g
from tools.patches import manager
from tools.patches.config import REPO, load_upstreams
from tools.patches.sources import ensure as ensure_sources
from tools.patches.sources import source_mode

PROFILES = ("cpu", "npu", "cuda")
# upstream -> how the profile installs its patched tree (None: sources and patches only)
INSTALLS: dict[str, dict[str, dict[str, str] | None]] = {
    "cpu": {"verl": {}, "megatron": {}, "vllm": None, "vllm-ascend": None},
    "cuda": {"verl": {}, "megatron": {}, "vllm": None, "vllm-ascend": None},
    # NPU: vLLM without its CUDA kernels (vllm-ascend provides the platform); not run here: no NPU
    "npu": {
        "verl": {},
        "megatron": {},
        "mindspeed": {},
        "vllm": {"VLLM_TARGET_DEVICE": "empty"},
        "vllm-ascend": {"COMPILE_CUSTOM_KERNELS": "1"},
    },
}
MINDSPEED_UNAVAILABLE = "NPU profile unavailable: MindSpeed needs git access or a mirror"


def detect_profile() -> str:
    if shutil.which("npu-smi") or any(Path("/dev").glob("davinci[0-9]*")):
        return "npu"
    if shutil.which("nvidia-smi"):
        return "cuda"
    return "cpu"


def run(cmd: list[str], env: dict[str, str] | None = None, *, venv: Path | None = None) -> None:
    """Run a command as if `venv` were activated (setup.py files call `python3` from PATH).

    Its output is kept and shown only when it fails."""
    print("  $ " + " ".join(cmd), flush=True)
    path = os.pathsep.join(filter(None, [str(venv / "bin") if venv else None, os.environ.get("PATH", "")]))
    proc = subprocess.run(
        cmd, cwd=REPO, env={**os.environ, "PATH": path, **(env or {})}, capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-5000:] + proc.stderr[-10000:])
        raise UserError(f"command failed ({proc.returncode}): {' '.join(cmd)}", fix="see its output above")


class Bootstrap:
    def __init__(self, profile: str, venv: Path):
        self.profile = profile
        self.venv = venv
        self.py = venv / "bin" / "python"
        self.state_file = venv / "ascend-r1-bootstrap.json"
        self.times: dict[str, float] = {}

    def state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def save(self, **values) -> None:
        atomic.write_json(self.state_file, {**self.state(), **values})

    def timed(self, step: str, fn) -> None:
        start = time.monotonic()
        print(f"== {step}", flush=True)
        fn()
        self.times[step] = self.times.get(step, 0.0) + time.monotonic() - start

    def check(self) -> None:
        """Before any work: the lock fits this Python and its inputs, and an existing environment made
        for another profile is never silently replaced."""
        spec = lock.SPECS[self.profile]
        lock.check_python(spec)
        lock.check_fresh(spec)
        made_for = self.state().get("profile")
        if made_for and made_for != self.profile:
            raise UserError(
                f"{self.venv} was made for the {made_for} profile, not {self.profile}",
                fix=f"use it with `make bootstrap PROFILE={made_for}`, or give this profile its own:"
                f" `make bootstrap PROFILE={self.profile} VENV=.venv-{self.profile}` (or remove {self.venv})",
            )

    def environment(self) -> None:
        spec = lock.SPECS[self.profile]
        want = hashlib.sha256(
            (REPO / spec.path).read_bytes() + (REPO / lock.SPECS["build"].path).read_bytes()
        ).hexdigest()
        if self.py.exists() and self.state().get("lock") == want:
            print(f"  {self.venv}: {spec.path} already installed")
            return
        if not self.py.exists():
            lock.make_venv(self.venv, with_pip=False)
        print(f"  installing {spec.path} into {self.venv} (uv, hashes required)", flush=True)
        lock.sync(spec, self.py)
        # the sync removes what the lock does not name, the editable upstreams included
        self.save(lock=want, profile=self.profile, installed={})

    def sources(self) -> None:
        names = list(INSTALLS[self.profile]) + (["mindspeed"] if self.profile != "npu" else [])
        upstreams = load_upstreams()
        mode = source_mode()
        for name in dict.fromkeys(names):
            try:
                print("  " + ensure_sources(upstreams[name], mode), flush=True)
            except UserError as e:
                if name != "mindspeed":
                    raise UserError(f"sources for {name} failed: {e}") from None
                if self.profile != "npu":
                    print(f"  {MINDSPEED_UNAVAILABLE} (the {self.profile} profile does not need it)")
                    continue
                raise UserError(
                    MINDSPEED_UNAVAILABLE,
                    fix="configure a mirror: git config --global "
                    "url.<mirror>.insteadOf https://gitcode.com/Ascend/MindSpeed.git",
                ) from None

    def patches(self) -> None:
        for up in load_upstreams().values():
            if g.is_repo(up.tree):
                print("  " + manager.apply(up))

    def packages(self) -> None:
        installed = self.state().get("installed", {})
        upstreams = load_upstreams()
        for name, env in INSTALLS[self.profile].items():
            if env is None:
                continue
            up = upstreams[name]
            head = g.rev(up.tree, "HEAD")
            if installed.get(name) == head:
                print(f"  {name}: installed from {up.path} at {head[:12]}")
                continue
            uv = lock.ensure_uv()
            run([str(uv), "pip", "install", "-q", "--python", str(self.py), "--no-deps",
                 "--no-build-isolation", "-e", str(up.path)], env=env, venv=self.venv)  # fmt: skip
            installed[name] = head
            self.save(installed=installed)
        if self.profile == "npu":
            print(
                "  Ascend apex: build it from source (gitcode ascend/apex: bash scripts/build.sh --python=3.11)"
                " and pip install the wheel; the PyPI project 'apex' is unrelated"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bootstrap", description=__doc__)
    parser.add_argument("--profile", choices=PROFILES, default=None, help="default: detected")
    parser.add_argument("--venv", type=Path, default=Path(".venv"))
    args = parser.parse_args(argv)
    profile = args.profile or detect_profile()
    print(f"profile: {profile}{'' if args.profile else ' (detected; set PROFILE= to choose)'}")
    b = Bootstrap(profile, (REPO / args.venv) if not args.venv.is_absolute() else args.venv)
    total = time.monotonic()
    try:
        b.check()
        b.timed("sources", b.sources)
        b.timed("installs", b.environment)
        b.timed("patching", b.patches)
        b.timed("installs", b.packages)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    split = ", ".join(f"{k} {v:.1f}s" for k, v in b.times.items())
    print(f"bootstrap done in {time.monotonic() - total:.1f}s ({split})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
