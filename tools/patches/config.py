"""patches/<stack>/upstreams.toml: each stack's pins, read and validated; gitlinks compared against them.

The default stack's trees live at third_party/<upstream>, every other stack's beside them at
third_party/stacks/<stack>/<upstream> (`stack_dir`); the superproject records the default stack's trees as
submodules (gitlinks = pins, `.gitmodules`), the other stacks' trees are ignored folders. `set-default`
moves the trees (tools/patches/default_stack.py).
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tools import stacks as st
from tools.errors import UserError

REPO = Path(__file__).resolve().parents[2]
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class PyPIRelease:
    name: str
    version: str
    sha256: str


@dataclass(frozen=True)
class Upstream:
    name: str
    path: Path  # relative to the repository root
    url: str
    tag: str
    commit: str | None  # None: unknown here (commit_unknown says why); the PyPI archive is the pin
    mirrors: tuple[str, ...] = ()
    pypi: PyPIRelease | None = None
    stack: str = "published"
    install: tuple[str, ...] = ()  # profiles that install the patched tree editable
    install_env: tuple[tuple[str, str], ...] = ()  # environment of that install (its build)
    overlay: str | None = None  # a binary distribution whose files the series' changes are copied over
    commit_unknown: str | None = None
    root: Path = field(default=REPO, compare=False)

    @property
    def tree(self) -> Path:
        return self.root / self.path

    @property
    def patch_dir(self) -> Path:
        return self.root / "patches" / self.stack / self.name

    @property
    def ref(self) -> str:
        """How commands and messages name it: <stack>/<upstream>."""
        return f"{self.stack}/{self.name}"

    @property
    def series_file(self) -> Path:
        return self.patch_dir / "series"

    @property
    def version(self) -> str:
        """The human name of the pin: tag and short commit."""
        return f"{self.tag} ({self.commit[:12] if self.commit else 'commit unknown'})"

    @property
    def pin(self) -> str:
        """What a series records as made-for: the tag and the commit, or the release archive's sha256."""
        return f"{self.tag} {self.commit or 'sha256:' + self.pypi.sha256}"


def _require(table: dict, key: str, where: str, kind: type = str):
    if key not in table:
        raise UserError(f"{where}: missing key '{key}'", fix=f"add `{key} = ...` to {where.split(' ')[0]}")
    value = table[key]
    if not isinstance(value, kind):
        raise UserError(f"{where}: key '{key}' must be a {kind.__name__}, got {type(value).__name__}")
    return value


THIRD_PARTY = Path("third_party")


def stack_dir(stack: str, root: Path = REPO, default: str | None = None) -> Path:
    """Where a stack's trees live, relative to the checkout: third_party/ for the default stack (the
    layout the distribution promises; `default`: as if that were the default), third_party/stacks/<stack>/
    for every other."""
    return THIRD_PARTY if stack == (default or st.default(root).name) else THIRD_PARTY / "stacks" / stack


def legacy_stack_dir(stack: str) -> Path:
    """Where every stack's trees lived before (third_party/<stack>/): bootstrap moves them from there."""
    return THIRD_PARTY / stack


def load_upstreams(root: Path = REPO, stack: str | None = None) -> dict[str, Upstream]:
    """Read and validate patches/<stack>/upstreams.toml, in file order (stack: see tools.stacks.resolve)."""
    stack = st.resolve(stack, root).name
    rel = st.Stack(stack, "").upstreams_toml
    toml_path = root / rel
    try:
        with open(toml_path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise UserError(f"{toml_path} not found", fix="run from the ascend-r1 checkout") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{toml_path}: not valid TOML: {e}") from None
    upstreams: dict[str, Upstream] = {}
    for name, table in data.items():
        where = f"{rel} [{name}]"
        if not isinstance(table, dict):
            raise UserError(f"{where}: expected a table")
        if "commit-unknown" in table and "commit" not in table:
            commit = None
            if "pypi" not in table:
                raise UserError(
                    f"{where}: commit-unknown needs a `pypi` release (the archive is then the pin)",
                    fix="give the full 40-hex `commit`, or a `pypi = {...}` release",
                )
        else:
            commit = _require(table, "commit", where)
            if not COMMIT_RE.match(commit):
                raise UserError(f"{where}: commit '{commit}' is not a full 40-hex commit id")
        pypi = None
        if "pypi" in table:
            p = _require(table, "pypi", where, dict)
            pwhere = f"{where} pypi"
            sha = _require(p, "sha256", pwhere)
            if not SHA256_RE.match(sha):
                raise UserError(f"{pwhere}: sha256 '{sha}' is not 64 lower-case hex digits")
            pypi = PyPIRelease(_require(p, "name", pwhere), _require(p, "version", pwhere), sha)
        if "path" in table:
            raise UserError(
                f"{where}: `path` is not set by hand: the default stack's trees live at third_party/<upstream>,"
                " every other stack's at third_party/stacks/<stack>/<upstream>",
                fix="remove the `path` line",
            )
        path = stack_dir(stack, root) / name
        install = tuple(_require(table, "install", where, list)) if "install" in table else ()
        bad = [p for p in install if p not in st.PROFILES]
        if bad:
            raise UserError(
                f"{where}: install lists unknown profile {bad[0]!r}", fix=f"use {', '.join(st.PROFILES)}"
            )
        env = _require(table, "install-env", where, dict) if "install-env" in table else {}
        upstreams[name] = Upstream(
            name=name,
            path=path,
            url=_require(table, "url", where),
            tag=_require(table, "tag", where),
            commit=commit,
            mirrors=tuple(_require(table, "mirrors", where, list)) if "mirrors" in table else (),
            pypi=pypi,
            stack=stack,
            install=install,
            install_env=tuple((str(k), str(v)) for k, v in env.items()),
            overlay=_require(table, "overlay", where) if "overlay" in table else None,
            commit_unknown=_require(table, "commit-unknown", where) if commit is None else None,
            root=root,
        )
    return upstreams


def tree_of(name: str, stack: str | None = None, root: Path = REPO) -> Path:
    """The working tree of upstream `name` in a stack (tools.stacks.resolve when None)."""
    return load_upstreams(root, stack)[name].tree


def select(upstreams: dict[str, Upstream], names: list[str] | None) -> list[Upstream]:
    if not names:
        return list(upstreams.values())
    unknown = [n for n in names if n not in upstreams]
    if unknown:
        stack = next(iter(upstreams.values())).stack if upstreams else "?"
        raise UserError(
            f"unknown upstream {', '.join(unknown)} in stack {stack}",
            fix=f"use one of: {', '.join(upstreams)} (patches/{stack}/upstreams.toml)",
        )
    return [upstreams[n] for n in names]


def gitlinks(root: Path = REPO, rev: str = "HEAD") -> dict[str, str]:
    """path -> commit for every gitlink in the superproject at `rev` (index when rev is None)."""
    if rev is None:
        out = subprocess.run(
            ["git", "ls-files", "-s"], cwd=root, capture_output=True, text=True, check=True
        ).stdout
        rows = [line.split(None, 3) for line in out.splitlines()]
        return {r[3]: r[1] for r in rows if r[0] == "160000"}
    out = subprocess.run(
        ["git", "ls-tree", "-r", rev], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    links = {}
    for line in out.splitlines():
        meta, path = line.split("\t", 1)
        mode, kind, obj = meta.split()
        if kind == "commit":
            links[path] = obj
    return links


def _gitmodules(root: Path) -> dict[str, str]:
    """.gitmodules: submodule path -> url."""
    out = subprocess.run(
        ["git", "config", "-f", ".gitmodules", "--get-regexp", r"^submodule\..*\.(path|url)$"],
        cwd=root,
        capture_output=True,
        text=True,
    ).stdout
    urls, paths = {}, {}
    for line in out.splitlines():
        key, value = line.split(" ", 1)
        sub = key[len("submodule.") : key.rindex(".")]
        (paths if key.endswith(".path") else urls)[sub] = value
    return {paths[s]: urls.get(s) for s in paths}


def check_pins(root: Path = REPO) -> list[str]:
    """Disagreements between the stacks' upstreams.toml, the gitlinks (index) and .gitmodules.

    The default stack's trees must be gitlinks at its pins with its urls in .gitmodules; no other stack's
    tree may be one (those are plain ignored folders). Empty when consistent."""
    problems = []
    links = gitlinks(root, rev=None)
    path_to_url = _gitmodules(root)
    default = st.default(root).name
    described = set()
    fix = (
        "run `python3 -m tools.patches set-default "
        + default
        + "` (pins move only with `make rebase-upstream`)"
    )
    for stack in st.load(root):
        for up in load_upstreams(root, stack).values():
            p = up.path.as_posix()
            described.add(p)
            where = f"patches/{stack}/upstreams.toml [{up.name}]"
            if stack != default or up.commit is None:  # commit-unknown: sources from the release archive only
                if p in links:
                    why = (
                        f"stack {stack} is not the default ({default})"
                        if stack != default
                        else "no commit is pinned"
                    )
                    problems.append(f"{p}: a gitlink, but {why}; {fix}")
                continue
            if p not in links:
                problems.append(f"{p}: no gitlink in the index; {where} pins {up.commit}; {fix}")
            elif links[p] != up.commit:
                problems.append(
                    f"{p}: gitlink is {links[p]} but {where} commit is {up.commit}"
                    f" (bump pins with `make rebase-upstream`, never by hand)"
                )
            if p not in path_to_url:
                problems.append(f".gitmodules: no submodule with path {p}; {fix}")
            elif path_to_url[p] != up.url:
                problems.append(f".gitmodules: {p} url is {path_to_url[p]} but {where} says {up.url}")
    for p in links:
        if p not in described:
            problems.append(f"{p}: gitlink not described in any patches/<stack>/upstreams.toml")
    for p in path_to_url:
        if p not in links:
            problems.append(f".gitmodules: {p} has no gitlink; {fix}")
    return problems
