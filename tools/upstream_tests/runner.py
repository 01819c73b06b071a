"""Run one upstream's checks on its pristine and patched trees, in a stack's environment, and compare.

Every run is a child process in a session of its own (the tests' own children, Ray's daemons among them,
are ended with it), with the tree under test first on PYTHONPATH and as the working directory, so
`import verl` (or megatron, vllm) is that tree's, which is checked before any test runs.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tools.errors import UserError
from tools.patches.config import Upstream
from tools.patches.series import load_series
from tools.upstream_tests import trees as tr
from tools.upstream_tests.compare import FAIL, SESSION, Comparison, Result, Results, compare, retry_candidates
from tools.upstream_tests.config import Check, UpstreamTests
from tools.upstream_tests.record import refresh_command

# pytest plugins for upstream sessions: a folder of uniquely named modules (no package), put on PYTHONPATH
# after the tree, so they neither shadow nor are shadowed by an upstream's own modules
PLUGINS = Path(__file__).resolve().parent / "plugins"
PLUGIN = "ascend_r1_upstream_report"
PYTEST_OK = (0, 1, 5)  # all passed, some failed, none collected


@dataclass
class Run:
    results: Results
    code: int | None  # None: stopped (timed out, or the thread limit)
    seconds: float
    log: Path
    stopped: str = ""


@dataclass
class CheckReport:
    check: Check
    status: str  # ran | skipped | manual | not applicable | error | stopped (timed out, or the thread limit)
    note: str = ""
    command: str = ""
    reason: str = ""  # skipped: why it could not run here, in a few words
    comparison: Comparison | None = None
    seconds: float = 0.0
    same_tree: bool = False
    logs: list[Path] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.status in ("error", "stopped") or bool(self.comparison and self.comparison.failed)


@dataclass
class UpstreamReport:
    up: Upstream
    checks: list[CheckReport] = field(default_factory=list)
    note: str = ""  # sources, repository, series
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return any(c.failed for c in self.checks)


def _env(tree: Path, check: Check, plugin_dir: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_R1_") and k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(plugin_dir)])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(dict(check.env))
    env.update(extra)
    return env


def _end_session(proc: subprocess.Popen) -> None:
    """End what is left of the run's session (its own process group): daemons the tests started."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.2)


# A run whose processes hold more threads than this is stopped: on a shared machine a test that leaks
# threads (gloo groups never destroyed, say) must not take the machine down. ASCEND_R1_UT_MAX_THREADS.
MAX_THREADS = 2000
POLL = 5.0


def max_threads() -> int:
    return int(os.environ.get("ASCEND_R1_UT_MAX_THREADS", MAX_THREADS))


def session_threads(sid: int) -> int:
    """Threads of every process in session `sid` (a run's own session), from /proc."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command name
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[3]) == sid:  # state ppid pgrp session ... num_threads (the 18th after the name)
            total += int(fields[17])
    return total


@dataclass
class Spawned:
    code: int | None  # None: stopped
    seconds: float
    stopped: str = ""  # why: timed out, or the thread limit


def _spawn(cmd: list[str], cwd: Path, env: dict[str, str], log: Path, timeout: float) -> Spawned:
    start = time.monotonic()
    stopped = ""
    with open(log, "ab") as out:
        out.write(f"$ cd {cwd} && {shlex.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        code: int | None = None
        try:
            while True:
                try:
                    code = proc.wait(timeout=POLL)
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() - start > timeout:
                        stopped = f"timed out after {timeout:.0f}s"
                        break
                    threads, limit = session_threads(proc.pid), max_threads()
                    if threads > limit:
                        stopped = f"stopped: its processes ran {threads} threads (limit {limit})"
                        break
        finally:
            _end_session(proc)
            proc.wait()
        if stopped:
            out.write(f"\n[ascend-r1 upstream-tests] {stopped}\n".encode())
    return Spawned(None if stopped else code, time.monotonic() - start, stopped)


def _tail(log: Path, tree: Path, lines: int = 1) -> str:
    """The last lines of a run's output (the verdict, usually), with the scratch tree's path left out."""
    text = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return " | ".join(text[-lines:]).replace(f"{tree}/", "")[-400:]


def read_results(path: Path) -> Results:
    results: Results = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill
            results[rec["id"]] = Result(rec["outcome"], rec.get("message", ""))
    return results


def preflight(python: Path, package: str, tree: Path, env: dict[str, str]) -> str | None:
    """None when `import package` in the run's setting finds it in `tree` (found, not imported: importing
    vLLM alone takes a minute here); else what happened."""
    code = (
        f"import os, importlib.util as u; s = u.find_spec({package!r}); "
        "print(os.path.abspath(s.origin or list(s.submodule_search_locations)[0]))"
    )
    proc = subprocess.run(
        [str(python), "-c", code], cwd=tree, env=env, capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        return f"{package} is not found: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    where = Path(proc.stdout.strip().splitlines()[-1])
    if not where.is_relative_to(tree):
        return f"import {package} would load {where}, not the tree under test {tree}"
    return None


def command_of(check: Check, python: Path | str = "python") -> str:
    if check.kind == "pytest":
        lines = shlex.join(["[pytest]", *check.ini])
        ini = f"printf '%s\\n' {lines} > pytest.ini && " if check.ini else ""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in check.env)
        return f"{ini}{env + ' ' if env else ''}{python} -m pytest {shlex.join(check.pytest)}"
    return shlex.join(script_command(list(check.run), str(python)))


def script_command(args: list[str], python: str) -> list[str]:
    """A script check's command: shell scripts (`.sh`) run with bash, the others with the stack's python."""
    return ["bash", *args] if args and args[0].endswith(".sh") else [python, *args]


def run_once(
    check: Check,
    python: Path,
    tree: Path,
    logs: Path,
    side: str,
    changed: list[str],
    select: list[str] | None = None,
) -> Run | None:
    """One run of a check on one tree; None when a `{changed:...}` placeholder matches nothing there."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{check.name}.{side}.log"
    plugin_dir = PLUGINS
    if check.kind == "script":
        args = tr.expand(check.run, tree, changed)
        if args is None:
            return None
        sp = _spawn(
            script_command(args, str(python)), tree, _env(tree, check, plugin_dir, {}), log, check.timeout
        )
        if sp.code is None:
            res = Result("error", sp.stopped)
        elif sp.code == 0:
            res = Result("passed")
        else:
            res = Result("failed", f"exit {sp.code}: {_tail(log, tree)}")
        return Run({check.name: res}, sp.code, sp.seconds, log, sp.stopped)
    report = logs / f"{check.name}.{side}.jsonl"
    report.unlink(missing_ok=True)
    extra = {"ASCEND_R1_UT_REPORT": str(report)}
    if select is not None:
        chosen = logs / f"{check.name}.{side}.select"
        chosen.write_text("".join(f"{s}\n" for s in select))
        extra["ASCEND_R1_UT_SELECT"] = str(chosen)
    ini = tree / "pytest.ini"
    before = ini.read_bytes() if ini.exists() else None
    if check.ini:  # as upstream's CI does (echo ... > pytest.ini); put back afterwards for the next check
        ini.write_text("[pytest]\n" + "".join(f"{line}\n" for line in check.ini))
    # a module that cannot be collected is one failing item (compared like any other), not the end of the run
    cmd = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-p", PLUGIN, "-q",
           "--continue-on-collection-errors", *check.pytest]  # fmt: skip
    try:
        sp = _spawn(cmd, tree, _env(tree, check, plugin_dir, extra), log, check.timeout)
    finally:
        if check.ini:
            ini.unlink(missing_ok=True) if before is None else ini.write_bytes(before)
    results = read_results(report)
    if sp.code is None:
        results[SESSION] = Result("error", f"{sp.stopped} ({len(results)} outcomes before)")
    elif sp.code not in PYTEST_OK:
        results[SESSION] = Result("error", f"pytest exit {sp.code}: {_tail(log, tree, 3)}")
    else:
        results[SESSION] = Result("collected")
    return Run(results, sp.code, sp.seconds, log, sp.stopped)


def _failing(results: Results) -> list[str]:
    return sorted(k for k, v in results.items() if v.outcome in FAIL)


def run_check(check: Check, python: Path, trees: tr.Trees, logs: Path, full: bool) -> CheckReport:
    rep = CheckReport(check, "ran", command=command_of(check))
    start = time.monotonic()
    patched = run_once(check, python, trees.patched, logs, "patched", trees.changed)
    if patched is None:
        rep.status, rep.note = "not applicable", "the series adds or changes no file it checks"
        return rep
    rep.logs.append(patched.log)
    if patched.code is None:  # stopped: what it did not reach is untested; a pristine run would be too
        rep.status, rep.note = "stopped", f"{patched.stopped}: the tests it did not reach are untested"
        rep.comparison = compare(patched.results, {}, pristine_full=False)
        rep.seconds = time.monotonic() - start
        return rep
    if trees.identical:
        rep.same_tree = True
        pristine_results, pristine_full = dict(patched.results), True
    else:
        failing = _failing(patched.results)
        select = None if (full or SESSION in failing or check.kind == "script") else failing
        if full or failing:
            pristine = run_once(check, python, trees.pristine, logs, "pristine", trees.changed, select)
            if pristine is None:  # nothing to check on the pristine tree: the series' files are all new
                pristine_results = {check.name: Result("passed", "the pristine tree has none of the files")}
            else:
                rep.logs.append(pristine.log)
                pristine_results = pristine.results
                if pristine.code is None:  # the patched failures it did not reach cannot be classified
                    rep.status = "stopped"
                    rep.note = f"the pristine run was {pristine.stopped}: the comparison is incomplete"
                    rep.comparison = compare(patched.results, {}, pristine_full=False)
                    rep.seconds = time.monotonic() - start
                    return rep
        else:
            pristine_results = {}
        pristine_full = select is None and (full or bool(failing))
    retry = None
    candidates = [] if trees.identical else retry_candidates(patched.results, pristine_results)
    if candidates:
        select = None if (SESSION in candidates or check.kind == "script") else candidates
        again = run_once(check, python, trees.patched, logs, "patched-retry", trees.changed, select)
        if again is not None:
            rep.logs.append(again.log)
            retry = again.results
    rep.comparison = compare(patched.results, pristine_results, pristine_full=pristine_full, retry=retry)
    rep.seconds = time.monotonic() - start
    return rep


def run_upstream(
    up: Upstream,
    spec: UpstreamTests,
    python: Path,
    logs: Path,
    *,
    full: bool = False,
    every: bool = False,
    only: list[str] | None = None,
    keep: Path | None = None,
    report=print,
) -> UpstreamReport:
    """Build the trees, fetch the repository where a check needs it, run every selected check."""
    out = UpstreamReport(up)
    start = time.monotonic()
    checks = [c for c in spec.checks if (not only or c.name in only)]
    # a manual check runs only when named; else it is reported as manual, with why
    manual = [c for c in checks if c.manual and not (only and c.name in only)]
    chosen = [c for c in checks if (full or every or c.ci) and c not in manual]
    try:
        _run_checks(out, up, spec, chosen, python, logs, full, keep, report)
    finally:
        order = {c.name: i for i, c in enumerate(checks)}
        out.checks += [
            CheckReport(
                c,
                "manual",
                f"{c.manual}; run it by name: `{refresh_command(up.stack, up.name, c.name)}`",
                command_of(c),
            )
            for c in manual
        ]
        out.checks += [
            CheckReport(c, "skipped", "only in `make upstream-tests` (--all)", command_of(c))
            for c in checks
            if c not in chosen and c not in manual
        ]
        out.checks.sort(key=lambda r: order[r.check.name])
        out.seconds = time.monotonic() - start
    return out


def _run_checks(
    out: UpstreamReport,
    up: Upstream,
    spec: UpstreamTests,
    chosen: list[Check],
    python: Path,
    logs: Path,
    full: bool,
    keep: Path | None,
    report,
) -> None:
    if not chosen:
        return
    shutil.rmtree(logs / up.name, ignore_errors=True)  # this run's logs only
    if not (up.tree / ".git").exists():
        for c in chosen:
            out.checks.append(
                CheckReport(
                    c,
                    "skipped",
                    f"no sources at {up.path} (make bootstrap STACK={up.stack} fetches them"
                    " for the profiles that use it)",
                    command_of(c),
                    reason=f"no sources at {up.path}",
                )  # fmt: skip
            )
        return
    if not load_series(up) and all(_only_changed(c) for c in chosen):  # nothing for them to read
        out.note = f"{up.tag}, series: 0 patch(es)"
        out.checks += [
            CheckReport(c, "not applicable", "the series adds or changes no file it checks", command_of(c))
            for c in chosen
        ]
        return
    work = Path(tempfile.mkdtemp(prefix=f"upstream-tests-{up.stack}-{up.name}-", dir=keep))
    try:
        try:
            trees = tr.build(up, work)
        except UserError as e:
            out.checks += [
                CheckReport(c, "error", f"the trees could not be built: {e}", command_of(c)) for c in chosen
            ]
            report(f"  {up.ref}: error: {e}")
            return
        series = f"{trees.patches} patch(es)" + (", pristine = patched" if trees.identical else "")
        out.note = (
            f"{up.tag} ({'commit ' + up.commit[:12] if up.commit else 'release archive'}), series: {series}"
        )
        needs_repo = [c for c in chosen if tr.missing(trees.pristine, c.needs)]
        other = spec.checks_from if up.commit is None else None  # the checks of another commit
        commit = up.commit or (other.commit if other else None)
        repo = tr.repository(up, commit) if needs_repo else None
        if repo is not None:
            out.note += f"; repository: {repo.note}"
            if other is not None:
                out.note += (
                    f"; the checks' files from {other.tag} ({other.commit[:12]}), not the pin: {other.why}"
                )
            if repo.path is not None and commit is not None:
                only = None if other is None else sorted({n for c in needs_repo for n in c.needs})
                added = [
                    tr.add_repository_files(t, repo.path, commit, only)
                    for t in (trees.pristine, trees.patched)
                ]
                out.note += f" (+{added[0]} files the archive lacks)"
        if spec.imports == "installed" and spec.package:
            installed = tr.installed_package(python, spec.package)
            for t in (trees.pristine, trees.patched):
                tr.use_installed(t, installed, spec.package, trees.changed, trees.deleted)
            out.note += f"; imports the installed {spec.package} ({installed}) with each tree's series files"
        report(f"  {up.ref}: {out.note}")
        harnessed: set[Path] = set()
        for c in chosen:
            lacking = tr.missing(trees.pristine, c.needs)
            if lacking:
                why = repo.note if repo is not None else "not in the release archive"
                how = (
                    f"; with git access to {up.url} (or a mirror: url.<mirror>.insteadOf) "
                    f"`make upstream-tests STACK={up.stack} UP={up.name}` runs it"
                    if commit else f"; pin the commit of {up.tag} in patches/{up.stack}/upstreams.toml to run it"
                )  # fmt: skip
                out.checks.append(
                    CheckReport(
                        c,
                        "skipped",
                        f"needs {', '.join(lacking)} (not in the release archive) from the"
                        f" repository at {commit or up.tag}: {why}{how}",
                        command_of(c),
                        reason=f"needs {', '.join(lacking)} from the repository at {commit or up.tag}: {why}",
                    )  # fmt: skip
                )
                report(f"  {up.ref} {c.name}: skipped ({why})")
                continue
            try:
                for h in c.harness_patches:
                    if h not in harnessed:
                        for t in (trees.pristine, trees.patched):
                            tr.apply_harness(t, (h,))
                        harnessed.add(h)
                if spec.package and c.kind == "pytest":
                    for side, t in (("patched", trees.patched), ("pristine", trees.pristine)):
                        problem = preflight(python, spec.package, t, _env(t, c, PLUGINS, {}))
                        if problem:
                            raise UserError(f"{side} tree: {problem}")
            except UserError as e:
                out.checks.append(CheckReport(c, "error", str(e), command_of(c)))
                report(f"  {up.ref} {c.name}: error: {e}")
                continue
            report(f"  {up.ref} {c.name}: running ({c.what or c.kind})")
            rep = run_check(c, python, trees, logs / up.name, full)
            out.checks.append(rep)
            report(f"  {up.ref} {c.name}: {summary(rep)} [{rep.seconds:.0f}s]")
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)


def _only_changed(check: Check) -> bool:
    """A script check that reads only the files the series changes (`{changed:...}` arguments)."""
    return check.kind == "script" and any(re.fullmatch(r"\{changed:[^}]+\}", a) for a in check.run)


def summary(rep: CheckReport) -> str:
    c = rep.comparison
    if c is None:
        return f"{rep.status}: {rep.note}"
    words = [f"{c.patched_passed}/{c.patched_run} pass patched"]
    if rep.same_tree:
        words.append("pristine = patched")
    elif c.pristine_full:
        words.append(f"{c.pristine_passed}/{c.pristine_run} pass pristine")
    else:
        words.append(f"pristine re-ran {c.pristine_run}, {c.pristine_passed} pass")
    words.append(f"{len(c.regressions) + len(c.new_failing)} regression(s)")
    if c.newly_passing:
        words.append(f"{len(c.newly_passing)} newly passing")
    if rep.status != "ran":
        words.append(f"{rep.status} {rep.note}")
    return ", ".join(words)
