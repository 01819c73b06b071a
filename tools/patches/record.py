"""patches/<stack>/verified.toml: the record of `make verify-patch-tests`, so CI re-verifies only what changed.

Each patch whose verdict was 'tested' (its Tested-By tests fail on a tree built without it) gets an entry
keyed by a digest of everything that verdict depends on:
- the stack's pins (patches/<stack>/upstreams.toml, every upstream: the tests import the other trees too)
  and every series of the stack, in order, with each patch file's bytes (the tree without a patch is the
  rest of its series, earlier and later patches, on the pin; the other upstreams' trees are patched too);
- the patch's Tested-By test files, the conftest.py and __init__.py files above them, the modules they import
  (followed by `ast`, transitively: tests/, tools/, bench/) and every data file under tests/;
- the environment lock of the stack and profile (locks/<stack>/<profile>.txt), pytest's settings in
  pyproject.toml, and RECORD_VERSION (bumped when the verdict logic changes).
What the digest does not see: files a test reads by path outside tests/ or runs in another process
(`make train` reads recipes/ and tools/ that way). The full `make verify-patch-tests` re-verifies all.

Only 'tested' entries count; a matching digest with another verdict is stale, as is a missing one.

The file format (`load_file`, `dump`, `save_file`) and the digest framing (`Digest`) are shared with
patches/<stack>/upstream-tests.verified.toml (tools/upstream_tests/record.py).
"""

from __future__ import annotations

import ast
import datetime
import functools
import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tools import atomic
from tools.errors import UserError
from tools.patches.config import Upstream
from tools.patches.series import Patch, read_series

RECORD_VERSION = "1"
LOCAL_PACKAGES = ("tests", "tools", "bench")
HEADER = """\
# Written by `make verify-patch-tests` (tools/patches/record.py); do not edit by hand.
# One entry per patch whose Tested-By tests FAIL on a tree built without it ('tested'), keyed by the
# digest of what that verdict depends on (the stack's pins and series, the patch's tests and what they
# import, the lock). CI (`make verify-patch-tests CHANGED=1`) re-verifies only patches whose digest differs.
# After changing a patch, its tests, a pin or the lock: run `make verify-patch-tests STACK=<stack>` and commit.
"""


@dataclass
class Entry:
    digest: str
    verdict: str
    date: str = ""
    seconds: float = 0.0
    profile: str = ""
    failed: list[str] = field(default_factory=list)
    summary: str = ""  # a line on what was run and found (written only when set)


class Digest:
    """sha256 over labelled parts, each framed by its label and length (no two inputs read alike)."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def part(self, label: str, data: bytes) -> None:
        self._h.update(f"{label}\0{len(data)}\0".encode())
        self._h.update(data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def record_path(root: Path, stack: str) -> Path:
    return root / "patches" / stack / "verified.toml"


def key(upstream: str, patch: str) -> str:
    return f"{upstream}/{patch}"


def load(root: Path, stack: str) -> dict[str, Entry]:
    """The stack's record: '<upstream>/<patch>' -> Entry (empty when there is none yet)."""
    return load_file(record_path(root, stack), f"make verify-patch-tests STACK={stack}")


def load_file(path: Path, refresh: str) -> dict[str, Entry]:
    """A record file: key -> Entry (empty when there is none yet); `refresh` is the command that rewrites it."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as e:
        raise UserError(
            f"{path}: not valid TOML: {e}",
            fix=f"restore it from git, or delete it and run `{refresh}`",
        ) from None
    entries = {}
    for name, table in data.items():
        if not isinstance(table, dict) or not isinstance(table.get("digest"), str):
            raise UserError(
                f"{path}: [{name!r}] has no digest string",
                fix=f"delete that entry and run `{refresh}`",
            )
        entries[name] = Entry(
            digest=table["digest"],
            verdict=str(table.get("verdict", "")),
            date=str(table.get("date", "")),
            seconds=float(table.get("seconds", 0.0)),
            profile=str(table.get("profile", "")),
            failed=[str(t) for t in table.get("failed", [])],
            summary=str(table.get("summary", "")),
        )
    return entries


def _string(s: str) -> str:
    return json.dumps(s)  # a TOML basic string: JSON's escapes are TOML's


def dump(entries: dict[str, Entry], header: str = HEADER) -> str:
    lines = [header]
    for name in sorted(entries):
        e = entries[name]
        lines += [
            f"[{_string(name)}]",
            f"digest = {_string(e.digest)}",
            f"verdict = {_string(e.verdict)}",
            f"date = {_string(e.date)}",
            f"seconds = {e.seconds:.1f}",
            f"profile = {_string(e.profile)}",
            *([f"summary = {_string(e.summary)}"] if e.summary else []),
            "failed = [" + "".join(f"\n  {_string(t)}," for t in e.failed) + ("\n]" if e.failed else "]"),
            "",
        ]
    return "\n".join(lines)


def save(root: Path, stack: str, entries: dict[str, Entry]) -> None:
    save_file(record_path(root, stack), entries)


def save_file(path: Path, entries: dict[str, Entry], header: str = HEADER) -> None:
    atomic.write_bytes(path, dump(entries, header).encode())


def today() -> str:
    return datetime.datetime.now(datetime.UTC).date().isoformat()


def matches(entry: Entry | None, digest: str) -> bool:
    """A record counts only for a 'tested' verdict on exactly these inputs."""
    return entry is not None and entry.verdict == "tested" and entry.digest == digest


# --- what a verdict depends on -------------------------------------------------------------------


def _module_files(root: Path, dotted: str) -> list[Path]:
    """The files of a repository module and the packages above it (none when it is not the repository's)."""
    parts = dotted.split(".")
    if parts[0] not in LOCAL_PACKAGES:
        return []
    found = []
    for i in range(1, len(parts) + 1):
        base = root.joinpath(*parts[:i])
        for candidate in (base / "__init__.py", base.with_suffix(".py")):
            if candidate.is_file():
                found.append(candidate)
                break
    return found


def _imports(root: Path, path: Path) -> list[Path]:
    stat = path.stat()
    return list(_imports_of(root, path, stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=4096)
def _imports_of(root: Path, path: Path, mtime_ns: int, size: int) -> tuple[Path, ...]:
    """The files `path` imports (cached while the file is unchanged: every patch's digest reads conftest.py)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):
        return ()  # unparsable: its bytes are in the digest anyway
    package = path.relative_to(root).with_suffix("").parts[:-1]
    found: list[Path] = []
    for node in ast.walk(tree):  # imports inside functions count too
        if isinstance(node, ast.Import):
            for alias in node.names:
                found += _module_files(root, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1] if node.level > 1 else package
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if not module:
                continue
            found += _module_files(root, module)
            for alias in node.names:  # `from pkg import submodule`
                found += _module_files(root, f"{module}.{alias.name}")
    return tuple(found)


def test_inputs(root: Path, tests: list[str]) -> list[Path]:
    """Every repository file the Tested-By tests depend on, sorted: the test files, the conftest.py and
    __init__.py files from tests/ down to them, the repository modules they import (transitively), the data under tests/."""
    todo: list[Path] = []
    for ref in tests:
        path = root / ref.split("::", 1)[0]
        todo.append(path)
        for parent in path.relative_to(root).parents:  # the packages and conftest.py files above it
            if parent.parts:
                todo += [
                    f for f in (root / parent / "conftest.py", root / parent / "__init__.py") if f.is_file()
                ]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        if path.suffix == ".py" and path.is_file():
            todo += _imports(root, path)
    tests_dir = root / "tests"
    if tests_dir.is_dir():
        seen |= {
            p
            for p in tests_dir.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
        }
    return sorted(seen)


def _pytest_settings(root: Path) -> str:
    try:
        data = tomllib.loads((root / "pyproject.toml").read_text())
    except (FileNotFoundError, tomllib.TOMLDecodeError):
        return ""
    return json.dumps(data.get("tool", {}).get("pytest", {}), sort_keys=True)


def pins(root: Path, stack: str) -> str:
    path = root / "patches" / stack / "upstreams.toml"
    return json.dumps(tomllib.loads(path.read_text()), sort_keys=True)  # comments and layout do not count


def file_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b"<missing>"


def digest(patch: Patch, stack_upstreams: list[Upstream], profile: str) -> str:
    """sha256 of what `patch`'s verdict depends on (see the module docstring), as 64 hex digits."""
    up = stack_upstreams[0]
    root, stack = up.root, up.stack
    h = Digest()
    part = h.part
    part("record-version", RECORD_VERSION.encode())
    part("patch", patch.path.read_bytes())
    part("pins", pins(root, stack).encode())
    for u in stack_upstreams:
        names = read_series(u)
        part(f"series {u.name}", "\n".join(names).encode())
        for name in names:
            part(f"patch {u.name}/{name}", file_bytes(u.patch_dir / name))
    part("lock", file_bytes(root / "locks" / stack / f"{profile}.txt"))
    part("pytest", _pytest_settings(root).encode())
    for path in test_inputs(root, patch.trailers.get("Tested-By", [])):
        part(f"file {path.relative_to(root).as_posix()}", file_bytes(path))
    return h.hexdigest()
