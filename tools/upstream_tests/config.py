"""patches/<stack>/upstream-tests.toml: each upstream's own checks, as its CI runs them.

    [verl]
    package = "verl"                       # the tree under test must provide it (checked before any test)

    [[verl.check]]
    name = "cpu-unit"                      # unique within the upstream
    what = "CPU unit tests, as cpu_unit_tests.yml runs them"
    pytest = ["tests", "--ignore=tests/single_controller"]   # pytest arguments, run in the tree
    ini = ["python_files = *_on_cpu.py", "asyncio_mode = auto"]  # a pytest.ini written into the tree
    env = { TORCH_COMPILE_DISABLE = "1" }
    needs = ["tests"]                      # paths the check reads; the repository supplies missing ones
    ci = true                              # in the default run, `make upstream-sanity` (CI); false:
                                           # only in `make upstream-tests` (--all) and --full
    timeout = 900                          # seconds, per run
    manual = "<why>"                       # it cannot run unattended: reported, never silently skipped,
                                           # and run only when named (`make upstream-tests CHECK=<name>`)

    [[verl.check]]
    name = "check_license"
    run = ["tests/special_sanity/check_license.py", "--directories", "."]   # a script, run with python;
                                           # passes when it exits 0. "{changed:*.py}" expands to the
                                           # files the series adds or changes that match the pattern
    needs = ["tests/special_sanity/check_license.py"]
    harness-patches = ["verl/check_license-....patch"]   # patches/<stack>/upstream-tests/<file>,
                                           # applied to BOTH trees before the check runs

A check whose `needs` are missing from the release archive runs on files of the upstream repository
at the pinned commit (tools/upstream_tests/trees.py); without git access it is reported as skipped.
Where the pin has no commit id (`commit-unknown`), an upstream table may name the commit whose check
files to use instead, with why they fit; then only the `needs` paths are added to both trees:

    [verl]
    checks-from = { commit = "<40 hex digits>", tag = "v0.9.0", why = "the newest tag reachable" }

Standard library only (the runner starts before, and outside, any environment).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tools.errors import UserError

FILE = "upstream-tests.toml"
HARNESS_DIR = "upstream-tests"
KEYS = {"name", "what", "pytest", "run", "ini", "env", "needs", "ci", "timeout", "harness-patches", "manual"}
UPSTREAM_KEYS = {"package", "check", "import", "checks-from"}


@dataclass(frozen=True)
class Check:
    upstream: str
    name: str
    what: str
    pytest: tuple[str, ...] = ()  # pytest arguments (a pytest check)
    run: tuple[str, ...] = ()  # a script and its arguments (a script check)
    ini: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    needs: tuple[str, ...] = ()
    ci: bool = True
    timeout: float = 900.0
    harness_patches: tuple[Path, ...] = ()
    manual: str = ""  # why it cannot run unattended (then it runs only when named)

    @property
    def kind(self) -> str:
        return "pytest" if self.pytest else "script"


@dataclass(frozen=True)
class UpstreamTests:
    upstream: str
    package: str | None
    imports: str  # "tree": the scratch tree is imported; "installed": the installed build, series overlaid
    checks: tuple[Check, ...] = field(default_factory=tuple)
    # where the pin has no commit id: the repository commit whose check files (`needs`) to use instead
    checks_from: ChecksFrom | None = None


@dataclass(frozen=True)
class ChecksFrom:
    commit: str  # 40 hex digits
    tag: str  # what it is, for the report
    why: str


def path(stack: str, root: Path) -> Path:
    return root / "patches" / stack / FILE


def _strings(value, where: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{where}: `{key}` must be a list of strings")
    return tuple(value)


def _checks_from(table: dict, where: str, upstreams: dict | None, up: str) -> ChecksFrom | None:
    """`checks-from = { commit = "<40 hex>", tag = "...", why = "..." }`: only for a pin with no commit id."""
    value = table.get("checks-from")
    if value is None:
        return None
    fix = 'write checks-from = { commit = "<40 hex digits>", tag = "<tag>", why = "<why these checks fit>" }'
    if not isinstance(value, dict) or set(value) != {"commit", "tag", "why"}:
        raise UserError(f"{where}: `checks-from` needs exactly commit, tag and why", fix=fix)
    commit = value["commit"]
    if not isinstance(commit, str) or not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise UserError(f"{where}: checks-from commit {commit!r} is not a 40-hex-digit commit id", fix=fix)
    if upstreams is not None and getattr(upstreams[up], "commit", None):
        raise UserError(
            f"{where}: `checks-from` is only for a pin with no commit id, and this pin has one",
            fix="remove `checks-from`: the checks come from the repository at the pinned commit",
        )
    return ChecksFrom(commit, str(value["tag"]), str(value["why"]))


def load(stack: str, root: Path, upstreams: dict | None = None) -> dict[str, UpstreamTests]:
    """The stack's checks per upstream, in file order; {} when the stack has no upstream-tests.toml."""
    file = path(stack, root)
    rel = file.relative_to(root)
    if not file.exists():
        return {}
    try:
        data = tomllib.loads(file.read_text())
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{rel}: not valid TOML: {e}") from None
    out: dict[str, UpstreamTests] = {}
    for up, table in data.items():
        where = f"{rel} [{up}]"
        if upstreams is not None and up not in upstreams:
            raise UserError(
                f"{where}: no upstream {up!r} in patches/{stack}/upstreams.toml",
                fix=f"use one of: {', '.join(upstreams)}",
            )
        if not isinstance(table, dict):
            raise UserError(f"{where}: expected a table")
        unknown = set(table) - UPSTREAM_KEYS
        if unknown:
            raise UserError(
                f"{where}: unknown key {sorted(unknown)[0]!r} (allowed: {', '.join(sorted(UPSTREAM_KEYS))})"
            )
        imports = table.get("import", "tree")
        if imports not in ("tree", "installed"):
            raise UserError(f'{where}: import = {imports!r}: use "tree" or "installed"')
        checks = []
        for i, c in enumerate(table.get("check", [])):
            cw = f"{where} check {i + 1}"
            if not isinstance(c, dict):
                raise UserError(f"{cw}: expected a table ([[{up}.check]])")
            unknown = set(c) - KEYS
            if unknown:
                raise UserError(
                    f"{cw}: unknown key {sorted(unknown)[0]!r} (allowed: {', '.join(sorted(KEYS))})"
                )
            name = c.get("name")
            if not isinstance(name, str) or not name:
                raise UserError(f'{cw}: missing `name = "..."`')
            cw = f"{where} check {name!r}"
            if any(x.name == name for x in checks):
                raise UserError(f"{cw}: the name is used twice", fix="give each check its own name")
            if ("pytest" in c) == ("run" in c):
                raise UserError(f"{cw}: give exactly one of `pytest = [...]` or `run = [...]`")
            env = c.get("env", {})
            if not isinstance(env, dict):
                raise UserError(f"{cw}: `env` must be a table of strings")
            timeout = c.get("timeout", 900)
            if not isinstance(timeout, int | float) or timeout <= 0:
                raise UserError(f"{cw}: `timeout` must be a positive number of seconds")
            if not isinstance(c.get("ci", True), bool):
                raise UserError(f"{cw}: `ci` must be true or false")
            manual = c.get("manual", "")
            if not isinstance(manual, str) or "manual" in c and not manual.strip():
                raise UserError(f'{cw}: `manual` must say why it cannot run unattended: manual = "<why>"')
            harness = []
            for p in _strings(c.get("harness-patches", []), cw, "harness-patches"):
                hp = root / "patches" / stack / HARNESS_DIR / p
                if not hp.is_file():
                    raise UserError(f"{cw}: harness patch {hp.relative_to(root)} does not exist")
                harness.append(hp)
            checks.append(
                Check(
                    upstream=up,
                    name=name,
                    what=str(c.get("what", "")),
                    pytest=_strings(c.get("pytest", []), cw, "pytest"),
                    run=_strings(c.get("run", []), cw, "run"),
                    ini=_strings(c.get("ini", []), cw, "ini"),
                    env=tuple((str(k), str(v)) for k, v in env.items()),
                    needs=_strings(c.get("needs", []), cw, "needs"),
                    ci=c.get("ci", True),
                    timeout=float(timeout),
                    harness_patches=tuple(harness),
                    manual=manual.strip(),
                )
            )
            if "pytest" in c and not checks[-1].pytest or "run" in c and not checks[-1].run:
                raise UserError(f"{cw}: the command is empty")
        package = table.get("package")
        if package is not None and not isinstance(package, str):
            raise UserError(f"{where}: `package` must be a string")
        out[up] = UpstreamTests(
            up, package, imports, tuple(checks), _checks_from(table, where, upstreams, up)
        )
    return out
