"""requirements.txt at the root: what a user installs for the default stack on an NPU node.

Made from the stack's own inputs and its lock, never by hand: every distribution that
requirements/<stack>/npu.txt (and the files it includes) names, at exactly the version of
locks/<stack>/npu.txt. `make bootstrap PROFILE=npu` installs the hash-locked environment instead; this file
is for a node that is set up with plain pip. `python3 -m tools.env requirements` writes it (`make lock` and
`python3 -m tools.patches set-default` too); `make lint` fails when it disagrees with the lock.

Standard library only: it runs before any environment exists.
"""

from __future__ import annotations

import re
from pathlib import Path

from tools import atomic
from tools import stacks as st
from tools.errors import UserError

REPO = Path(__file__).resolve().parents[2]
PATH = Path("requirements.txt")
PROFILE = "npu"
FIX = "run `python3 -m tools.env requirements` (after `make lock`) and commit requirements.txt"
# the PyPI project named apex is an unrelated web toolkit: Ascend's apex is built from source
NEVER = {"apex"}
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?")
_PINNED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def direct(path: Path, root: Path = REPO) -> list[tuple[str, str]]:
    """(name, extras) of each requirement in `path` and the files it includes with `-r`, in order."""
    found: list[tuple[str, str]] = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r"):
            found += direct(path.parent / line[2:].strip(), root)
            continue
        m = _NAME.match(line)
        if m is None or line.startswith("-"):
            continue
        if normalize(m.group(1)) not in {normalize(n) for n, _ in found}:
            found.append((m.group(1), m.group(2) or ""))
    return found


def locked(path: Path) -> dict[str, str]:
    """name (normalized) -> version of every distribution in a lock file."""
    return {
        normalize(m.group(1)): m.group(2)
        for line in path.read_text().splitlines()
        if (m := _PINNED.match(line))
    }


def inputs(root: Path = REPO) -> Path:
    """requirements/<default stack>/npu.txt (the stack may have no NPU profile: then it does not exist)."""
    return root / "requirements" / st.default(root).name / f"{PROFILE}.txt"


def render(root: Path = REPO) -> str:
    stack = st.default(root).name
    src = inputs(root)
    lock = root / "locks" / stack / f"{PROFILE}.txt"
    versions = locked(lock)
    names = direct(src, root)
    bad = [n for n, _ in names if normalize(n) in NEVER]
    if bad:
        raise UserError(
            f"{src.relative_to(root)} names {', '.join(bad)}: the PyPI project of that name is not Ascend's apex",
            fix="drop it; Ascend apex is built from source (see requirements.txt's header)",
        )
    missing = [n for n, _ in names if normalize(n) not in versions]
    if missing:
        raise UserError(
            f"{lock.relative_to(root)} has no version of {', '.join(missing)}",
            fix=f"run `make lock NAMES={stack}`",
        )
    lines = [
        f"# The default stack ({stack}) on an Ascend NPU node: what `pip install -r requirements.txt` needs, at the",
        f"# versions of locks/{stack}/{PROFILE}.txt (hash-locked; `make bootstrap PROFILE=npu` installs that instead).",
        f"# Generated from requirements/{stack}/{PROFILE}.txt by `python3 -m tools.env requirements`; do not edit.",
        "#",
        "# Not from PyPI, and installed besides these:",
        f"# - the patched upstreams, from third_party/ after `make bootstrap STACK={stack} PROFILE=npu` (pip install",
        "#   --no-deps -e each of verl, megatron, vllm, vllm-ascend, mindspeed: `install` in upstreams.toml);",
        "# - Ascend apex, built from source (the PyPI project named apex is unrelated and is never listed here):",
        "#   git clone https://gitcode.com/Ascend/apex && cd apex && bash scripts/build.sh --python=3.11, then",
        "#   pip install the wheel it leaves in apex/dist/;",
        "# - CANN and, where the stack needs it, triton-ascend from Ascend's index (requirements/"
        f"{stack}/{PROFILE}.txt says how).",
    ]
    lines += [f"{n}{extras}=={versions[normalize(n)]}" for n, extras in names]
    return "\n".join(lines) + "\n"


def check(root: Path = REPO) -> list[str]:
    """Where requirements.txt disagrees with the default stack's NPU lock (empty when it agrees)."""
    path = root / PATH
    if not path.is_file():
        return [f"{PATH} is missing; {FIX}"]
    want = render(root)
    have = path.read_text()
    if have == want:
        return []
    theirs = {normalize(m.group(1)): m.group(2) for line in have.splitlines() if (m := _PINNED.match(line))}
    ours = {normalize(m.group(1)): m.group(2) for line in want.splitlines() if (m := _PINNED.match(line))}
    diff = [f"{n} {theirs.get(n, 'missing')} (lock: {v})" for n, v in ours.items() if theirs.get(n) != v]
    diff += [f"{n} (not in the lock's inputs)" for n in theirs if n not in ours]
    return [
        f"{PATH} disagrees with locks/{st.default(root).name}/{PROFILE}.txt: {'; '.join(diff) or 'its text'}; {FIX}"
    ]


def write(root: Path = REPO) -> str:
    atomic.write_bytes(root / PATH, render(root).encode())
    return f"wrote {PATH} (stack {st.default(root).name}, {PROFILE})"
