"""verify-patch-tests: every patch's `Tested-By` tests must fail when that patch is left out.

For each patch in turn: a scratch clone of its upstream's tree at the pristine base, the series applied
without that patch (a later patch that does not apply without it is left out too, and reported), and
the patch's `Tested-By` tests run in a fresh pytest process with `ASCEND_R1_TREE_<NAME>` pointing at
the scratch tree (tests/conftest.py `upstream_tree`). The patch is tested when at least one of its
tests fails there; a patch whose tests all pass without it is reported as untested. Tests that check
a gate-off path (upstream behaviour) pass on purpose: they are listed, and do not count either way.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from tools.patches import git as g
from tools.patches import manager
from tools.patches import record as rec
from tools.patches.config import Upstream, load_upstreams
from tools.patches.series import Patch, load_series, read_series


@dataclass
class Outcome:
    upstream: str
    patch: str
    tests: list[str]
    verdict: str = "?"  # tested | NOT TESTED | error
    failed: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)  # later patches that need this one
    detail: str = ""
    seconds: float = 0.0
    digest: str = ""  # of what the verdict depends on (tools.patches.record)
    recorded: bool = False  # the record matched: not run again (--only-changed)


def tree_env_name(upstream: str) -> str:
    return f"ASCEND_R1_TREE_{upstream.upper().replace('-', '_')}"


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    """A temporary folder for the scratch trees; the bytecode Python cached for them under
    PYTHONPYCACHEPREFIX (make sets it: build/pycache) goes with it, or each verification would leave
    its trees' bytecode behind under a new temporary name."""
    with tempfile.TemporaryDirectory(prefix="verify-patch-tests-") as tmp:
        try:
            yield Path(tmp)
        finally:
            cache = os.environ.get("PYTHONPYCACHEPREFIX")
            if cache:
                shutil.rmtree(Path(cache) / Path(tmp).relative_to(Path(tmp).anchor), ignore_errors=True)


def scratch_tree(up: Upstream, without: Patch, patches: list[Patch], dest: Path) -> list[str]:
    """Clone up.tree to dest at the pristine base and apply `patches` minus `without`.

    Returns the names of later patches that did not apply without it (left out as well).
    """
    base = manager.require_tree(up)
    if dest.exists():
        shutil.rmtree(dest)
    g.git(up.tree.parent, "clone", "-q", "--shared", "--no-checkout", str(up.tree), str(dest))
    g.git(dest, "checkout", "-q", "-f", "-B", "verify", base)
    left_out = []
    for patch in patches:
        if patch.name == without.name:
            continue
        code, _ = manager.am(dest, patch.path)
        if code != 0:
            g.git(dest, "am", "--abort", check=False)
            left_out.append(patch.name)
    return left_out


def _junit(path: Path) -> tuple[list[str], list[str]]:
    failed, passed = [], []
    if not path.exists():
        return failed, passed
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(name)
        elif case.find("skipped") is None:
            passed.append(name)
    return failed, passed


def run_tests(root: Path, tests: list[str], env: dict[str, str], junit: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *tests]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=1800)


def verify_patch(up: Upstream, patch: Patch, patches: list[Patch], work: Path) -> Outcome:
    tests = patch.trailers.get("Tested-By", [])
    out = Outcome(up.name, patch.name, tests)
    start = time.monotonic()
    if not tests:
        out.verdict, out.detail = "NOT TESTED", "no Tested-By trailer"
        return out
    work = work / patch.path.stem  # each patch its own scratch tree and report (verifications may overlap)
    work.mkdir(parents=True, exist_ok=True)
    dest = work / up.name
    out.left_out = scratch_tree(up, patch, patches, dest)
    env = {**os.environ, tree_env_name(up.name): str(dest)}
    junit = work / "junit.xml"
    junit.unlink(missing_ok=True)
    proc = run_tests(up.root, tests, env, junit)
    out.failed, out.passed = _junit(junit)
    out.seconds = time.monotonic() - start
    if proc.returncode in (0, 1) and (out.failed or out.passed):
        out.verdict = "tested" if out.failed else "NOT TESTED"
        if not out.failed:
            out.detail = "all its tests pass without it"
    else:
        out.verdict = "error"
        out.detail = f"pytest exit {proc.returncode}: " + (proc.stdout + proc.stderr)[-1500:]
    return out


def control(up: Upstream, patches: list[Patch], work: Path, tested: list[Patch] | None = None) -> list[str]:
    """The tests of every patch (of `tested`, when given) on a scratch tree WITH the whole series: they must
    pass there, or a failure without a patch proves nothing. Returns the tests that fail (empty when all pass)."""
    tests = list(dict.fromkeys(t for p in (tested or patches) for t in p.trailers.get("Tested-By", [])))
    if not tests:
        return []
    dest = work / up.name
    missing = Patch(Path("<none>"), "", "", {}, [], 0)
    left_out = scratch_tree(up, missing, patches, dest)
    if left_out:
        return [f"the series does not apply: {', '.join(left_out)}"]
    junit = work / "junit-control.xml"
    junit.unlink(missing_ok=True)
    proc = run_tests(up.root, tests, {**os.environ, tree_env_name(up.name): str(dest)}, junit)
    failed, passed = _junit(junit)
    if proc.returncode not in (0, 1) or not (failed or passed):
        return [f"pytest exit {proc.returncode}: " + (proc.stdout + proc.stderr)[-1500:]]
    # what failed, and why: the end of each failure's message, so that a CI log alone says it
    return [f"{name}\n{why[-1500:]}" for name, why in _failure_messages(junit, failed)]


def _failure_messages(junit: Path, names: list[str]) -> list[tuple[str, str]]:
    why = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        node = case.find("failure") if case.find("failure") is not None else case.find("error")
        if node is not None:
            why[f"{case.get('classname', '')}::{case.get('name', '')}"] = (
                node.text or node.get("message") or ""
            ).strip()
    return [(name, why.get(name, "")) for name in names]


def verify(
    chosen: list[Upstream],
    only: list[str] | None = None,
    report=print,
    control_run: bool = True,
    jobs: int = 1,
    only_changed: bool = False,
    profile: str = "cpu",
    write_record: bool = True,
) -> list[Outcome]:
    """`jobs` > 1 verifies that many patches at once (each in its own scratch tree and pytest process);
    the outcomes and the report keep the series order.

    The stack's record (tools.patches.record, patches/<stack>/verified.toml) gets an entry for each patch
    verified 'tested' and loses the entry of every other one verified now. `only_changed` verifies only the
    patches whose record does not match (their outcome for the others: 'tested', recorded=True)."""
    outcomes = []
    if not chosen:
        return outcomes
    root, stack = chosen[0].root, chosen[0].stack
    stack_upstreams = list(load_upstreams(root, stack).values())
    record = rec.load(root, stack)
    with scratch_dir() as work:
        for up in chosen:
            patches = load_series(up)
            selected = [p for p in patches if not only or p.name in only]
            if not selected:
                continue
            digests = {p.name: rec.digest(p, stack_upstreams, profile) for p in selected}
            if only_changed:
                stale = []
                for patch in selected:
                    entry = record.get(rec.key(up.name, patch.name))
                    if rec.matches(entry, digests[patch.name]):
                        report(f"{up.name}: {patch.name}: verified earlier (record {entry.digest[:12]})")
                        outcomes.append(
                            Outcome(up.name, patch.name, patch.trailers.get("Tested-By", []), "tested",
                                    failed=list(entry.failed), detail=f"verified earlier ({entry.date})",
                                    digest=entry.digest, recorded=True)
                        )  # fmt: skip
                    else:
                        stale.append(patch)
                selected = stale
                if not selected:
                    continue
            if control_run:
                report(f"{up.name}: control run, the whole series applied: the tests must pass")
                broken = control(up, patches, work, selected)  # the whole series, even with --patch
            else:
                report(f"{up.name}: no control run (the caller ran these tests on the patched tree)")
                broken = []
            if broken:
                names = [b.split("\n", 1)[0] for b in broken]
                for patch in selected:
                    outcomes.append(
                        Outcome(up.name, patch.name, patch.trailers.get("Tested-By", []), "error",
                                detail="tests fail WITH the whole series: " + "; ".join(names)[:2000],
                                digest=digests[patch.name])
                    )  # fmt: skip
                    record.pop(rec.key(up.name, patch.name), None)
                report("  error: the tests fail with the whole series:\n" + "\n".join(broken))
                if write_record:
                    rec.save(root, stack, record)
                continue
            with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                runs = {pool.submit(verify_patch, up, patch, patches, work): patch for patch in selected}
                # said as each one ends (progress on a long run); the outcomes keep the series order
                for run in as_completed(runs):
                    patch, o = runs[run], run.result()
                    o.digest = digests[patch.name]
                    if rec.digest(patch, stack_upstreams, profile) != o.digest:
                        o.verdict = "error"
                        o.detail = "its inputs changed while it was verified: run it again"
                    _remember(record, up, patch, o, profile)
                    if write_record:
                        rec.save(root, stack, record)  # each verdict kept at once: a long run may be cut off
                    report(
                        f"{up.name}: {patch.name} left out, its "
                        f"{len(patch.trailers.get('Tested-By', []))} test reference(s) run:\n"
                        f"  {o.verdict}: {len(o.failed)} failed, {len(o.passed)} passed without the patch "
                        f"[{o.seconds:.1f}s]"
                        + (f"; also left out (need it): {', '.join(o.left_out)}" if o.left_out else "")
                        + (f"\n  {o.detail}" if o.detail else "")
                    )
            outcomes += [run.result() for run in runs]
    # entries of patches no longer in their series go
    series = {rec.key(u.name, n) for u in stack_upstreams for n in read_series(u)}
    if write_record and any(k not in series for k in record):
        rec.save(root, stack, {k: e for k, e in record.items() if k in series})
    order = {(u.name, n): i for i, (u, n) in enumerate((u, n) for u in chosen for n in read_series(u))}
    return sorted(outcomes, key=lambda o: order.get((o.upstream, o.patch), len(order)))


def _remember(record: dict[str, rec.Entry], up: Upstream, patch: Patch, o: Outcome, profile: str) -> None:
    name = rec.key(up.name, patch.name)
    if o.verdict == "tested":
        record[name] = rec.Entry(
            o.digest, o.verdict, rec.today(), round(o.seconds, 1), profile, list(o.failed)
        )
    else:
        record.pop(name, None)  # an untested or failing patch has no record: CI verifies it again
