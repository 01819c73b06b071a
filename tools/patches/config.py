"""patches/upstreams.toml: the pins, read and validated; gitlinks compared against them."""

from __future__ import annotations

import re
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tools.errors import UserError

REPO = Path(__file__).resolve().parents[2]
UPSTREAMS_TOML = Path("patches") / "upstreams.toml"
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
    commit: str
    mirrors: tuple[str, ...] = ()
    pypi: PyPIRelease | None = None
    root: Path = field(default=REPO, compare=False)

    @property
    def tree(self) -> Path:
        return self.root / self.path

    @property
    def patch_dir(self) -> Path:
        return self.root / "patches" / self.name

    @property
    def series_file(self) -> Path:
        return self.patch_dir / "series"

    @property
    def version(self) -> str:
        """The human name of the pin: tag and short commit."""
        return f"{self.tag} ({self.commit[:12]})"


def _require(table: dict, key: str, where: str, kind: type = str):
    if key not in table:
        raise UserError(f"{where}: missing key '{key}'", fix=f"add `{key} = ...` to {where.split(' ')[0]}")
    value = table[key]
    if not isinstance(value, kind):
        raise UserError(f"{where}: key '{key}' must be a {kind.__name__}, got {type(value).__name__}")
    return value


def load_upstreams(root: Path = REPO) -> dict[str, Upstream]:
    """Read and validate upstreams.toml, in file order."""
    toml_path = root / UPSTREAMS_TOML
    try:
        with open(toml_path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise UserError(f"{toml_path} not found", fix="run from the ascend-r1 checkout") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{toml_path}: not valid TOML: {e}") from None
    upstreams: dict[str, Upstream] = {}
    for name, table in data.items():
        where = f"{UPSTREAMS_TOML} [{name}]"
        if not isinstance(table, dict):
            raise UserError(f"{where}: expected a table")
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
        upstreams[name] = Upstream(
            name=name,
            path=Path(_require(table, "path", where)),
            url=_require(table, "url", where),
            tag=_require(table, "tag", where),
            commit=commit,
            mirrors=tuple(_require(table, "mirrors", where, list)) if "mirrors" in table else (),
            pypi=pypi,
            root=root,
        )
    return upstreams


def select(upstreams: dict[str, Upstream], names: list[str] | None) -> list[Upstream]:
    if not names:
        return list(upstreams.values())
    unknown = [n for n in names if n not in upstreams]
    if unknown:
        raise UserError(
            f"unknown upstream {', '.join(unknown)}",
            fix=f"use one of: {', '.join(upstreams)} (patches/upstreams.toml)",
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


def check_pins(root: Path = REPO) -> list[str]:
    """Disagreements between upstreams.toml, the gitlinks (index) and .gitmodules; empty when consistent."""
    problems = []
    ups = load_upstreams(root)
    links = gitlinks(root, rev=None)
    modules = subprocess.run(
        ["git", "config", "-f", ".gitmodules", "--get-regexp", r"^submodule\..*\.(path|url)$"],
        cwd=root,
        capture_output=True,
        text=True,
    ).stdout
    module_urls = {}
    module_paths = {}
    for line in modules.splitlines():
        key, value = line.split(" ", 1)
        sub = key[len("submodule.") : key.rindex(".")]
        (module_paths if key.endswith(".path") else module_urls)[sub] = value
    path_to_url = {module_paths[s]: module_urls.get(s) for s in module_paths}
    for up in ups.values():
        p = up.path.as_posix()
        if p not in links:
            problems.append(f"{p}: no gitlink in the index; upstreams.toml [{up.name}] pins {up.commit}")
        elif links[p] != up.commit:
            problems.append(
                f"{p}: gitlink is {links[p]} but upstreams.toml [{up.name}] commit is {up.commit}"
                f" (bump pins with `make rebase-upstream`, never by hand)"
            )
        if p not in path_to_url:
            problems.append(f".gitmodules: no submodule with path {p}")
        elif path_to_url[p] != up.url:
            problems.append(f".gitmodules: {p} url is {path_to_url[p]} but upstreams.toml says {up.url}")
    known = {u.path.as_posix() for u in ups.values()}
    for p in links:
        if p not in known:
            problems.append(f"{p}: gitlink not described in upstreams.toml")
    return problems
