"""`make upstream-tests`: each upstream's own sanity scripts and CPU unit tests, pristine pin against
patched tree, in each stack's environment. Fails on any test that passes pristine and fails patched.

    python3 -m tools.upstream_tests [--stack S] [--profile P] [--all | --full | --changed] [--check NAME]
                                    [--keep DIR] [UP ...]

Without --stack every bootstrapped stack runs (as `make test`). The checks of a stack are declared in
patches/<stack>/upstream-tests.toml; by default those marked `ci = true` (the sanity scripts: `make
upstream-sanity`, run by CI), `--all` every check (`make upstream-tests`: the unit-test comparisons too),
`--full` every check and the pristine tree in full too (that is what counts "newly passing"). A check that needs the upstream
repository (files the release archive lacks) and cannot have it is reported as skipped, with why and the
command it would run. A check marked `manual = "<why>"` runs only when named (--check), and is reported.

Every check that runs with no regression is recorded in patches/<stack>/upstream-tests.verified.toml under
a digest of its inputs (tools/upstream_tests/record.py). `--changed` (`make upstream-tests CHANGED=1`, CI)
runs only the checks whose record is stale; a stale one that cannot run here (its files need git access
to the upstream repository) fails as UNVERIFIED, with the command that refreshes its record.
Logs and a JSON summary: build/upstream-tests/<stack>/.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from tools import atomic
from tools import stacks as st
from tools.errors import UserError, run_cli
from tools.patches import record as rec
from tools.patches.config import load_upstreams, select
from tools.suite import environments
from tools.upstream_tests import config
from tools.upstream_tests import record as urec
from tools.upstream_tests.runner import CheckReport, UpstreamReport, run_upstream, summary

REPO = Path(__file__).resolve().parents[2]
OUT = Path("build") / "upstream-tests"
DETAIL_LINES = 8


def _cell(rep: CheckReport) -> dict[str, str]:
    c = rep.comparison
    row = {"check": rep.check.name, "kind": rep.check.kind}
    if c is None:
        return {**row, "tests": "-", "pass pristine": "-", "pass patched": "-", "regressions": "-",
                "newly passing": "-", "fail both": "-", "status": f"{rep.status}: {rep.note}"}  # fmt: skip
    if rep.same_tree:
        pristine = "= patched"
    elif c.pristine_full:
        pristine = f"{c.pristine_passed}/{c.pristine_run}"
    else:
        pristine = f"{c.pristine_passed}/{c.pristine_run} re-run"
    status = "FAIL" if rep.failed else "ok"
    if rep.status == "stopped":
        status += f" ({rep.note})"
    if c.flaky:
        status += f", {len(c.flaky)} flaky"
    return {
        **row,
        "tests": str(c.patched_run),
        "pass pristine": pristine,
        "pass patched": str(c.patched_passed),
        "regressions": str(len(c.regressions) + len(c.new_failing)),
        "newly passing": str(len(c.newly_passing)) if (c.pristine_full or rep.same_tree) else "-",
        "fail both": str(len(c.both_fail)),
        "status": f"{status} [{rep.seconds:.0f}s]",
    }


def print_table(rows: list[dict[str, str]], indent: str = "  ") -> None:
    keys = list(rows[0])
    widths = {k: max(len(k), *(len(r[k]) for r in rows)) for k in keys}
    print(indent + "  ".join(k.ljust(widths[k]) for k in keys))
    for r in rows:
        print(indent + "  ".join(r[k].ljust(widths[k]) for k in keys))


def print_report(stack: str, reports: list[UpstreamReport]) -> None:
    for rep in reports:
        print(f"\n== stack {stack}, {rep.up.name}: {rep.note or rep.up.tag} [{rep.seconds:.0f}s]")
        if not rep.checks:
            print("  no checks selected")
            continue
        print_table([_cell(c) for c in rep.checks])
        for c in rep.checks:
            if c.status == "skipped" and c.command:
                print(f"  {c.check.name}: would run (in the {rep.up.name} tree): {c.command}")
            cmp_ = c.comparison
            if cmp_ is None:
                continue
            for title, items in (
                ("REGRESSION (passes pristine, fails patched)", [(k, m) for k, m, _ in cmp_.regressions]),
                ("FAILS on the patched tree, absent from the pristine one", cmp_.new_failing),
                ("newly passing (fails pristine, passes patched)", cmp_.newly_passing),
                ("flaky (failed patched once, passed on a second patched run)", cmp_.flaky),
                ("fails on both trees (not counted)", cmp_.both_fail),
                ("other changes (pristine -> patched)", [(k, f"{a} -> {b}") for k, a, b in cmp_.changed]),
            ):
                if not items:
                    continue
                print(f"  {c.check.name}: {title}: {len(items)}")
                for k, msg in items[:DETAIL_LINES]:
                    print(f"    {k}: {msg}"[:240])
                if len(items) > DETAIL_LINES:
                    print(f"    ... {len(items) - DETAIL_LINES} more (logs: {c.logs[0].parent})")


def to_json(stack: str, reports: list[UpstreamReport], full: bool, seconds: float) -> dict:
    def one(c: CheckReport) -> dict:
        d = {"check": c.check.name, "kind": c.check.kind, "status": c.status, "note": c.note,
             "command": c.command, "seconds": round(c.seconds, 1), "same_tree": c.same_tree}  # fmt: skip
        if c.comparison is not None:
            x = c.comparison
            d.update(
                patched_run=x.patched_run, patched_passed=x.patched_passed, pristine_run=x.pristine_run,
                pristine_passed=x.pristine_passed, pristine_full=x.pristine_full,
                regressions=[list(r) for r in x.regressions], new_failing=[list(r) for r in x.new_failing],
                newly_passing=[list(r) for r in x.newly_passing], both_fail=[list(r) for r in x.both_fail],
                flaky=[list(r) for r in x.flaky], changed=[list(r) for r in x.changed],
            )  # fmt: skip
        return d

    return {
        "stack": stack,
        "full": full,
        "seconds": round(seconds, 1),
        "upstreams": [
            {
                "upstream": r.up.name,
                "note": r.note,
                "seconds": round(r.seconds, 1),
                "checks": [one(c) for c in r.checks],
            }
            for r in reports
        ],
    }


def _digests(root: Path, ups: dict, specs: dict, names: list[str], profile: str) -> dict[str, str]:
    return {
        urec.key(n, c.name): urec.digest(root, ups[n], specs[n], c, profile)
        for n in names
        for c in specs[n].checks
    }


def _stale(
    stack: str, record: dict[str, rec.Entry], digests: dict[str, str], specs: dict, names: list[str], only
) -> dict[str, list[str]]:
    """--changed: the checks (per upstream) whose record does not match, reporting the others."""
    stale: dict[str, list[str]] = {}
    for n in names:
        fresh, manual = [], []
        for c in specs[n].checks:
            if only and c.name not in only:
                continue
            k = urec.key(n, c.name)
            if c.manual and not (only and c.name in only):
                state = "recorded" if urec.matches(record.get(k), digests[k]) else "no matching record"
                manual.append(f"{c.name} ({state}; {c.manual})")
            elif urec.matches(record.get(k), digests[k]):
                fresh.append(c.name)
            else:
                stale.setdefault(n, []).append(c.name)
        words = [f"{len(fresh)} check(s) verified earlier (record)"]
        if n in stale:
            words.append(f"to run: {', '.join(stale[n])}")
        print(f"  {stack}/{n}: {'; '.join(words)}")
        for m in manual:
            print(f"  {stack}/{n}: MANUAL, not run: {m}")
    return stale


def _remember(
    root: Path,
    stack: str,
    profile: str,
    reports: list[UpstreamReport],
    before: dict[str, str],
    after: dict[str, str],
) -> list[str]:
    """Write each check's verdict into the record; returns the checks whose inputs changed meanwhile."""
    record = urec.load(root, stack)
    moved = []
    for r in reports:
        for c in r.checks:
            k = urec.key(r.up.name, c.check.name)
            if c.status in ("skipped", "manual"):
                continue  # not verified now: its entry (matching or not) stays as it was
            if c.failed:
                record.pop(k, None)
                continue
            if before.get(k) != after.get(k):
                moved.append(k)
                continue
            verdict = "not applicable" if c.status == "not applicable" else "no regressions"
            record[k] = rec.Entry(
                digest=after[k], verdict=verdict, date=rec.today(), seconds=round(c.seconds, 1),
                profile=profile, summary=summary(c) if c.comparison else c.note,
            )  # fmt: skip
    urec.save(root, stack, {k: e for k, e in record.items() if k in after})
    return moved


def run_stack(
    stack: st.Stack, python: Path, args: argparse.Namespace, root: Path = REPO, profile: str = "cpu"
) -> tuple[bool, float]:
    start = time.monotonic()
    ups = load_upstreams(root, stack.name)
    specs = config.load(stack.name, root, ups)
    if not specs:
        print(
            f"==== stack {stack.name}: no {config.path(stack.name, root).relative_to(root)}: nothing to run"
        )
        return True, 0.0
    names = args.upstreams or list(specs)
    for n in select(ups, names):
        if n.name not in specs:
            raise UserError(f"{n.ref}: no checks in {config.path(stack.name, root).relative_to(root)}")
    changed = getattr(args, "changed", False)
    mode = (" (--full)" if args.full else " (--changed)" if changed else " (--all)" if args.all
            else " (ci = true checks)")  # fmt: skip
    print(f"==== stack {stack.name}{mode}: {python}", flush=True)
    before = _digests(root, ups, specs, list(specs), profile)
    to_run: dict[str, list[str] | None] = {n: args.check for n in names}
    if changed:
        stale = _stale(stack.name, urec.load(root, stack.name), before, specs, names, args.check)
        to_run = {n: stale[n] for n in names if n in stale}
        if not to_run:
            took = time.monotonic() - start
            print(f"==== stack {stack.name}: ok, every check's record matches ({took:.2f}s)", flush=True)
            return True, took
    logs = root / OUT / stack.name
    reports = []
    for name, only in to_run.items():
        reports.append(
            run_upstream(
                ups[name],
                specs[name],
                python,
                logs,
                full=args.full,
                every=args.all or changed,
                only=only,
                keep=Path(args.keep).resolve() if args.keep else None,
                report=lambda line: print(line, flush=True),
            )  # fmt: skip
        )
    took = time.monotonic() - start
    print_report(stack.name, reports)
    logs.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(
        logs / "summary.json",
        (json.dumps(to_json(stack.name, reports, args.full, took), indent=1) + "\n").encode(),
    )
    after = _digests(root, ups, specs, list(specs), profile)
    for k in _remember(root, stack.name, profile, reports, before, after):
        print(f"  {k}: its inputs changed while it ran: not recorded (run it again)")
    ok = not any(r.failed for r in reports)
    if changed:  # a stale record that could not be renewed here
        for r in reports:
            for c in r.checks:
                if c.status == "skipped":
                    ok = False
                    print(
                        f"UNVERIFIED {stack.name}/{r.up.name}/{c.check.name}: its record is stale and it cannot "
                        f"run here ({c.reason or c.note}); refresh it with "
                        f"`{urec.refresh_command(stack.name, r.up.name, c.check.name)}` where git reaches "
                        f"{r.up.url}, and commit {urec.record_path(root, stack.name).relative_to(root)}",
                        flush=True,
                    )
    print(
        f"\n==== stack {stack.name}: {'ok' if ok else 'FAILED'} in {took:.0f}s (logs: {logs.relative_to(root)})",
        flush=True,
    )
    return ok, took


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m tools.upstream_tests", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("upstreams", nargs="*", help="default: every upstream with checks")
    parser.add_argument("--stack", help="default: every bootstrapped stack")
    parser.add_argument("--profile", choices=st.PROFILES)
    parser.add_argument("--all", action="store_true", help="every check, not only the `ci = true` ones")
    parser.add_argument("--full", action="store_true", help="every check, and the pristine tree in full")
    parser.add_argument(
        "--changed",
        action="store_true",
        help="only the checks whose record (upstream-tests.verified.toml) is stale",
    )
    parser.add_argument("--check", action="append", help="only this check (repeatable)")
    parser.add_argument("--keep", metavar="DIR", help="build the scratch trees in DIR and keep them")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # a stopped run ends its tests' sessions and scratch trees too
    profile = args.profile or st.detect_profile()
    runs = environments(args.stack, profile)
    failed = []
    for stack, python in runs:
        ok, _ = run_stack(stack, python, args, profile=profile)
        if not ok:
            failed.append(stack.name)
    if failed:
        print(
            f"error: upstream tests regressed or could not run on stack {', '.join(failed)}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    run_cli(main)
