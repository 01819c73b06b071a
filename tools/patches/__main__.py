"""python -m tools.patches <command> [--stack S] [upstream ...]: the patch-series manager (see `make help`).

apply, unapply, export, status, sources, rebase and verify-tests work on one stack (--stack, else
$ASCEND_R1_STACK, else the default in patches/stacks.toml); check, lint and table on every stack unless
--stack names one; check-pins always on every stack; set-default <name> makes <name> the default stack
(patches/stacks.toml), moves the trees (the default stack's to third_party/<upstream>) and the gitlinks
and .gitmodules with them.
"""

from __future__ import annotations

import argparse
import sys
import time

from tools import atomic
from tools import stacks as st
from tools.errors import USER_ERROR, UserError, run_cli
from tools.patches import carry, default_stack, manager, rebase, sources, table, verify
from tools.patches import check as checking
from tools.patches.config import REPO, check_pins, load_upstreams, select
from tools.patches.series import lint, read_series
from tools.upstream_tests import config as upstream_checks


def _print_table(rows: list[dict[str, str]]) -> None:
    keys = list(rows[0])
    widths = {k: max(len(k), *(len(r[k]) for r in rows)) for k in keys}
    print("  ".join(k.ljust(widths[k]) for k in keys))
    for r in rows:
        print("  ".join(r[k].ljust(widths[k]) for k in keys))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.patches", description=__doc__)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--stack", help="default: $ASCEND_R1_STACK, else the default stack (check/lint/table: all)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in [
        ("apply", "apply each series on top of its pin (no-op when stamped)"),
        ("unapply", "back to the pristine pin, refusing to destroy edits"),
        ("export", "commits on top of the pin -> patches/<up>/*.patch + series"),
        ("check", "CI: strict apply on fresh trees, blob ids, byte-identical re-export, lint, table"),
        ("lint", "series/file consistency, trailers, whitespace"),
        ("status", "pin, source, clean/dirty, patches applied"),
        ("sources", "fetch pristine sources (git, else PyPI) where missing"),
    ]:
        p = sub.add_parser(name, help=text, parents=[common])
        p.add_argument("upstreams", nargs="*", help="default: all")
    sub.add_parser("table", help="regenerate the patch tables in docs/patches.md", parents=[common])
    vt = sub.add_parser(
        "verify-tests",
        help="each patch's Tested-By tests must fail on trees built without that patch",
        parents=[common],
    )
    vt.add_argument("upstreams", nargs="*", help="default: all")
    vt.add_argument("--patch", action="append", help="only this patch file name (repeatable)")
    vt.add_argument("--jobs", type=int, default=1, help="patches verified at once (default 1)")
    vt.add_argument(
        "--only-changed",
        action="store_true",
        help="CI: skip each patch whose record (patches/<stack>/verified.toml) matches its digest; verify the rest",
    )
    vt.add_argument(
        "--profile", choices=st.PROFILES, help="whose lock the digest reads (default: this machine's)"
    )
    vt.add_argument(
        "--no-control",
        dest="control",
        action="store_false",
        help="skip the control run (the tests with the whole series): only when these tests have just passed "
        "on the patched trees, as in CI, where `make test` runs first",
    )
    sub.add_parser("check-pins", help="upstreams.toml vs gitlinks vs .gitmodules")
    sd = sub.add_parser("set-default", help="make a stack the default (the gitlinks and .gitmodules follow)")
    sd.add_argument("name")
    rb = sub.add_parser(
        "rebase", help="move an upstream to a new ref and carry the series (3-way)", parents=[common]
    )
    rb.add_argument("upstream")
    rb.add_argument("ref", nargs="?", help="git tag/commit, or a PyPI version where git is unreachable")
    rb.add_argument("--commit", help="with PyPI: the release's commit id (PyPI does not record it)")
    rb.add_argument("--tag", help="with PyPI: the release's git tag")
    rb.add_argument("--continue", dest="resume", action="store_true", help="after resolving a conflict")
    rb.add_argument("--abort", action="store_true", help="give up, back to the old tree")
    rb.add_argument(
        "--from",
        dest="source",
        metavar="STACK",
        help="carry STACK's series of this upstream onto this stack's pin",
    )
    args = parser.parse_args(argv)
    return _run(args)


def _stack_names(args: argparse.Namespace) -> list[str]:
    """check, lint, table: every stack unless --stack names one."""
    return [st.resolve(args.stack).name] if getattr(args, "stack", None) else list(st.load())


def _run(args: argparse.Namespace) -> int:
    if args.command in ("check", "lint", "table"):
        return _run_every_stack(args)
    if args.command == "set-default":
        for line in default_stack.set_default(args.name):
            print(line)
        return 0
    if args.command == "check-pins":
        problems = check_pins()
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        if problems:
            return USER_ERROR
        print("pins: upstreams.toml, gitlinks and .gitmodules agree")
        return 0
    every = load_upstreams(stack=getattr(args, "stack", None))
    if args.command == "rebase":
        (up,) = select(every, [args.upstream])
        if args.abort:
            print(rebase.abort(up))
        elif args.resume:
            print(rebase.resume(up))
        elif args.source:
            (source,) = select(load_upstreams(stack=st.resolve(args.source).name), [args.upstream])
            print(rebase.carry(up, source))
        else:
            if not args.ref:
                raise UserError("rebase needs a REF", fix="make rebase-upstream UP=<name> REF=<tag|version>")
            print(rebase.rebase(up, args.ref, commit=args.commit, tag=args.tag))
        return 0
    chosen = select(every, args.upstreams)
    if args.command == "verify-tests":
        return _verify_tests(args, chosen)
    if args.command == "status":
        stack = st.resolve(getattr(args, "stack", None))
        print(f"stack {st.describe(stack)}: {stack.description}")
        _print_table([manager.status(u) for u in chosen])
        return 0
    if args.command == "sources":
        mode = sources.source_mode()
        for u in chosen:
            print(sources.ensure(u, mode))
        return 0
    action = {"apply": manager.apply, "unapply": manager.unapply, "export": manager.export}[args.command]
    failed = 0
    for u in chosen:
        if args.command != "export" and not read_series(u) and not u.tree.joinpath(".git").exists():
            print(f"{u.name}: no sources and no patches (skipped)")
            continue
        if args.command == "export" and not u.tree.joinpath(".git").exists():
            continue
        start = time.monotonic()
        try:
            print(f"{action(u)}  [{time.monotonic() - start:.2f}s]")
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            failed += 1
    return USER_ERROR if failed else 0


def _verify_tests(args: argparse.Namespace, chosen: list) -> int:
    outcomes = verify.verify(
        chosen,
        args.patch,
        control_run=args.control,
        jobs=args.jobs,
        only_changed=args.only_changed,
        profile=args.profile or st.detect_profile(),
    )
    if not outcomes:
        print("verify-tests: no patches")
        return 0
    _print_table(
        [
            {
                "upstream": o.upstream,
                "patch": o.patch,
                "without it": o.verdict + (" (record)" if o.recorded else ""),
                "tests failing": f"{len(o.failed)}/{len(o.failed) + len(o.passed)}"
                if not o.recorded
                else f"{len(o.failed)}",
            }
            for o in outcomes
        ]
    )
    stack = chosen[0].stack
    where = f"patches/{stack}/verified.toml"
    bad = [o for o in outcomes if o.verdict != "tested"]
    for o in bad:
        print(
            f"error: {o.upstream}/{o.patch}: {o.verdict}: {o.detail}\n  fix: "
            + ("make its Tested-By tests fail without it" if o.verdict == "NOT TESTED" else "fix what failed")
            + f", then run `make verify-patch-tests STACK={stack} PATCH={o.patch}` and commit {where}",
            file=sys.stderr,
        )
    if args.only_changed:
        stale = [o for o in outcomes if not o.recorded]
        if stale:
            print(
                f"record is stale for {len(stale)} patch(es) of stack {stack} "
                f"({', '.join(f'{o.upstream}/{o.patch}' for o in stale)}): verified now; "
                f"run `make verify-patch-tests STACK={stack}` and commit {where}"
            )
        else:
            print(f"record matches for all {len(outcomes)} patches of stack {stack} ({where})")
    return 1 if bad else 0


def _run_every_stack(args: argparse.Namespace) -> int:
    # the table and Requires: always see every stack; --stack narrows what is checked
    per_stack = {name: load_upstreams(stack=name) for name in st.load()}
    everything = {n: list(u.values()) for n, u in per_stack.items()}
    if args.command == "table":
        atomic.write_bytes(REPO / table.DOC, table.updated_doc(everything).encode())
        print(f"wrote {table.DOC}")
        return 0
    names = _stack_names(args)
    chosen = {n: select(per_stack[n], args.upstreams) for n in names}
    count = sum(len(read_series(u)) for ups in chosen.values() for u in ups)
    if args.command == "check":
        problems = check_pins() + checking.check(chosen, everything)
    else:
        problems = []
        for n, ups in chosen.items():
            all_series = {u.name: read_series(u) for u in everything[n]}
            problems += [p for u in ups for p in lint(u, all_series)]
            problems += carry.lint(n, everything)
            try:  # the stack's upstream checks (make upstream-tests) parse and name its upstreams
                upstream_checks.load(n, REPO, per_stack[n])
            except UserError as e:
                problems.append(str(e))
    if args.command == "lint" and not table.is_fresh(everything):
        problems.append(f"{table.DOC} is stale: run `python3 -m tools.patches table`")
    checking.fail_if(problems)
    stacks = ", ".join(names)
    if args.command == "lint":
        print(f"lint: {count} patches clean ({stacks})")
    else:
        print(f"check: {count} patches apply strictly and re-export identically ({stacks})")
    return 0


if __name__ == "__main__":
    run_cli(main)
