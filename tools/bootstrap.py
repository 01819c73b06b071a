"""`make bootstrap`: for one stack and profile, pristine sources, the locked virtual environment, patches,
patched packages.

Sources come first and need nothing but the standard library (no torch, no build). The environment is
`locks/<stack>/<profile>.txt` installed exactly by uv (`uv pip sync --require-hashes`: nothing missing,
nothing extra) into `.venv-<stack>-<profile>`, so stacks and profiles never share one. Idempotent: every
step records what it did (lock digest, tree commit per installed package), so a second run with nothing
changed only checks and finishes in about a second.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tools import atomic
from tools import stacks as st
from tools.env import lock
from tools.errors import UserError, run_cli
from tools.patches import default_stack, manager, overlay, sources
from tools.patches import git as g
from tools.patches.config import REPO, Upstream, load_upstreams
from tools.patches.series import read_series
from tools.patches.sources import ensure as ensure_sources
from tools.patches.sources import source_mode

PROFILES = st.PROFILES
detect_profile = st.detect_profile
MINDSPEED_UNAVAILABLE = "NPU profile unavailable: MindSpeed needs git access or a mirror"


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
    def __init__(self, profile: str, venv: Path, stack: str | None = None):
        self.stack = st.resolve(stack).name
        self.profile = profile
        self.venv = venv
        self.py = venv / "bin" / "python"
        self.state_file = venv / st.STATE_FILE
        self.times: dict[str, float] = {}
        self.upstreams = load_upstreams(stack=self.stack)
        self.spec = lock.profile_spec(self.stack, profile)

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

    def needed(self) -> list[Upstream]:
        """The upstreams this stack and profile need trees of: those it installs, and those whose series
        has patches (tests and `make check-patches` apply them)."""
        return [u for u in self.upstreams.values() if self.profile in u.install or read_series(u)]

    def check(self) -> None:
        """Before any work: the lock fits this Python and its inputs, and an existing environment made
        for another stack or profile is never silently replaced."""
        st.check_venv(self.venv, self.stack, self.profile)
        lock.check_machine(self.spec)
        lock.check_python(self.spec)
        lock.check_fresh(self.spec)

    def environment(self) -> None:
        spec = self.spec
        want = hashlib.sha256(
            (REPO / spec.path).read_bytes() + (REPO / lock.SPECS["build"].path).read_bytes()
        ).hexdigest()
        if self.py.exists() and self.state().get("lock") == want:
            print(f"  {self.venv.name}: {spec.path} already installed")
            return
        if not self.py.exists():
            lock.make_venv(self.venv, with_pip=False)
        print(f"  installing {spec.path} into {self.venv.name} (uv, hashes required)", flush=True)
        lock.sync(spec, self.py)
        # the sync removes what the lock does not name, the editable upstreams included (an overlaid
        # distribution it keeps keeps the overlay, which the record still describes)
        self.save(lock=want, stack=self.stack, profile=self.profile, installed={})

    def sources(self) -> None:
        mode = source_mode()
        # a checkout of the layout before (third_party/<stack>/<upstream>): its trees move to their places
        for line in default_stack.adopt_legacy_trees():
            print("  moved " + line, flush=True)
        for up in self.upstreams.values():
            sources.protect_gitlink(
                up
            )  # also the trees this profile leaves alone: `git add -A` must not move a pin
        needed = self.needed()
        for up in needed:
            try:
                print("  " + ensure_sources(up, mode), flush=True)
            except UserError as e:
                if up.name == "mindspeed":
                    raise UserError(
                        MINDSPEED_UNAVAILABLE,
                        fix=f"configure a mirror: git config --global url.<mirror>.insteadOf {up.url}",
                    ) from None
                raise UserError(f"sources for {up.ref} failed: {e}") from None
        skipped = [u.name for u in self.upstreams.values() if u not in needed]
        if skipped:
            print(
                f"  not needed by the {self.profile} profile (nothing to install or check): {', '.join(skipped)}"
            )

    def patches(self) -> None:
        for up in self.needed():
            if g.is_repo(up.tree):
                print("  " + manager.apply(up))

    def packages(self) -> None:
        installed = self.state().get("installed", {})
        for up in self.upstreams.values():
            if self.profile not in up.install:
                continue
            head = g.rev(up.tree, "HEAD")
            # an editable install names its folder, so a moved tree installs again; an overlay copies files
            key = head if up.overlay else f"{head} {up.path}"
            if installed.get(up.name) == key:
                print(f"  {up.name}: installed from {up.path} at {head[:12]}")
                continue
            if up.overlay:
                overlays = self.state().get("overlays", {})
                record = overlay.apply(up, overlay.site_packages(self.py), overlays.get(up.name, {}))
                print(f"  {up.name}: {len(record)} file(s) of {up.path}'s series overlaid onto {up.overlay}")
                installed[up.name] = key
                self.save(installed=installed, overlays={**overlays, up.name: record})
                continue
            uv = lock.ensure_uv()
            run([str(uv), "pip", "install", "-q", "--python", str(self.py), "--no-deps",
                 "--no-build-isolation", "-e", str(up.path)], env=dict(up.install_env), venv=self.venv)  # fmt: skip
            installed[up.name] = key
            self.save(installed=installed)
        if self.profile == "npu":
            print(
                "  Ascend apex: build it from source (gitcode ascend/apex: bash scripts/build.sh --python=3.11)"
                " and pip install the wheel; the PyPI project 'apex' is unrelated"
            )
            locked = (REPO / self.spec.path).read_text()
            for name, version in st.resolve(self.stack).npu.items():
                if name != "cann" and f"\n{name}==" not in locked:  # not on PyPI, so not in the lock
                    print(
                        f"  {name}=={version} is not on PyPI: {self.py} -m pip install {name}=={version}"
                        " --extra-index-url https://mirrors.huaweicloud.com/ascend/repos/pypi"
                    )

    def summary(self) -> str:
        """One line: which stack and versions this environment holds."""
        pins = ", ".join(
            f"{u.name} {u.pypi.version if u.pypi else u.tag}"
            for u in self.upstreams.values()
            if self.profile in u.install
        )
        torch = next(
            (line.split()[0].split("==")[1] for line in (REPO / self.spec.path).read_text().splitlines()
             if line.startswith("torch==")),
            "?",
        )  # fmt: skip
        return f"stack {self.stack}, profile {self.profile} in {self.venv.name}: {pins}; torch {torch}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bootstrap", description=__doc__)
    parser.add_argument("--stack", default=None, help="default: $ASCEND_R1_STACK, else patches/stacks.toml")
    parser.add_argument("--profile", choices=PROFILES, default=None, help="default: detected")
    parser.add_argument("--venv", type=Path, default=None, help="default: .venv-<stack>-<profile>")
    args = parser.parse_args(argv)
    profile = args.profile or detect_profile()
    total = time.monotonic()
    stack = st.resolve(args.stack)
    venv = args.venv or Path(st.venv_name(stack.name, profile))
    print(
        f"stack: {stack.name}{' (default; STACK= picks another)' if stack.default and not args.stack else ''}"
        f" - {stack.description}\nprofile: {profile}{'' if args.profile else ' (detected; PROFILE= picks another)'}"
    )
    b = Bootstrap(profile, venv if venv.is_absolute() else REPO / venv, stack.name)
    b.check()
    b.timed("sources", b.sources)
    b.timed("installs", b.environment)
    b.timed("patching", b.patches)
    b.timed("installs", b.packages)
    split = ", ".join(f"{k} {v:.1f}s" for k, v in b.times.items())
    print(f"bootstrap done in {time.monotonic() - total:.1f}s ({split})\n{b.summary()}")
    return 0


if __name__ == "__main__":
    run_cli(main)
