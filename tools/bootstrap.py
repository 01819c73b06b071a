"""`make bootstrap`: pristine sources, the virtual environment for a profile, patches, patched packages.

Idempotent: every step records what it did (requirements digest, tree commit per installed package), so
a second run with nothing changed only checks and finishes in seconds. Needs only the standard library.
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
from tools.errors import UserError
from tools.patches import git as g
from tools.patches import manager
from tools.patches.config import REPO, load_upstreams

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


def digest(paths: list[Path], extra: str) -> str:
    h = hashlib.sha256(extra.encode())
    for p in paths:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def requirement_files(profile: str) -> list[Path]:
    return [REPO / "requirements.txt", REPO / f"requirements-{profile}.txt", REPO / "requirements-dev.txt"]


def run(cmd: list[str], env: dict[str, str] | None = None, *, stream: bool = False) -> None:
    """Run a command as if the venv were activated (setup.py files call `python3` from PATH).

    Output is shown as it comes when `stream`, else kept and shown only when the command fails."""
    print("  $ " + " ".join(cmd), flush=True)
    bindir = str(Path(cmd[0]).parent) if cmd[0].endswith("/python") else None
    path = os.pathsep.join(filter(None, [bindir, os.environ.get("PATH", "")]))
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

    def environment(self) -> None:
        if not self.py.exists():
            run([sys.executable, "-m", "venv", str(self.venv)])
        files = requirement_files(self.profile)
        want = digest(files, f"{self.profile} {sys.version_info[:2]}")
        if self.state().get("requirements") == want:
            print(f"  {self.venv}: requirements unchanged")
            return
        run([str(self.py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--upgrade", "pip"])
        print(
            "  installing the requirements (a few minutes the first time; pip shows its progress)", flush=True
        )
        args = [str(self.py), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "on"]
        for f in files:
            args += ["-r", str(f.relative_to(REPO))]
        run(args, stream=True)
        self.save(requirements=want, profile=self.profile)

    def sources(self) -> None:
        names = list(INSTALLS[self.profile]) + (["mindspeed"] if self.profile != "npu" else [])
        for name in dict.fromkeys(names):
            cmd = [str(self.py), "-m", "tools.patches", "sources", name]
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            if proc.returncode == 0:
                print("  " + proc.stdout.strip())
            elif name == "mindspeed" and self.profile != "npu":
                print(f"  {MINDSPEED_UNAVAILABLE} (the {self.profile} profile does not need it)")
            elif name == "mindspeed":
                raise UserError(
                    MINDSPEED_UNAVAILABLE,
                    fix="configure a mirror: git config --global "
                    "url.<mirror>.insteadOf https://gitcode.com/Ascend/MindSpeed.git",
                )
            else:
                raise UserError(f"sources for {name} failed:\n{proc.stderr.strip()}")

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
            run(
                [
                    str(self.py),
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--disable-pip-version-check",
                    "--no-deps",
                    "--no-build-isolation",
                    "-e",
                    str(up.path),
                ],
                env=env,
            )
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
        b.timed("installs", b.environment)
        b.timed("sources", b.sources)
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
