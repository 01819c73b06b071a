"""python -m tools.env: the hash locks (`lock`, `check-locks`), the root requirements.txt made from them
(`requirements`, checked by `check-locks`) and pip's index settings (`settings`)."""

from __future__ import annotations

import argparse
import sys
import time

from tools.env import lock, pipconf, requirements
from tools.errors import USER_ERROR, UserError, run_cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.env", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("lock", help="resolve locks/<name>.txt from the requirement files (all by default)")
    p.add_argument("names", nargs="*", metavar="NAME", help="<stack>, <stack>/<profile>, bootstrap or build")
    p.add_argument(
        "--upgrade",
        action="store_true",
        help="the newest versions the requirement files allow (default: every locked version is kept where "
        "the requirement files still allow it)",
    )
    p = sub.add_parser("check-locks", help="fail when a lock is older than its inputs")
    p.add_argument("names", nargs="*", metavar="NAME")
    sub.add_parser("settings", help="the indexes, find-links, certificate and proxy read from pip")
    sub.add_parser(
        "requirements", help="write requirements.txt: the default stack's NPU needs at its lock's versions"
    )
    args = parser.parse_args(argv)
    if args.command == "settings":
        s = pipconf.read()
        print(s.describe())
        for key, section in sorted(s.origin.items()):
            print(f"  {key}: from {section}")
        return 0
    if args.command == "requirements":
        print(requirements.write())
        return 0
    names = []
    for n in args.names or list(lock.SPECS):
        whole_stack = [s for s in lock.SPECS if s.startswith(n + "/")]
        if n not in lock.SPECS and not whole_stack:
            raise UserError(
                f"unknown lock {n!r}",
                fix=f"choose from {', '.join(lock.SPECS)} (or a stack's name for all its profiles)",
            )
        names += [n] if n in lock.SPECS else whole_stack
    if args.command == "lock":
        # bootstrap first: the others are made with the uv it pins
        for name in sorted(names, key=lambda n: n != "bootstrap"):
            start = time.monotonic()
            target = lock.REPO / lock.SPECS[name].path
            before = requirements.locked(target) if target.is_file() else {}
            path = lock.compile_lock(lock.SPECS[name], upgrade=args.upgrade)
            after = requirements.locked(path)
            changes = lock.version_changes(before, after) if before else []  # a new lock changed nothing
            if not before:
                kept = "new"
            elif changes:
                kept = f"{len(changes)} changed"
            else:
                kept = "every version kept"
            print(
                f"{path.relative_to(lock.REPO)}: {len(after)} distributions, {kept} ({time.monotonic() - start:.1f}s)"
            )
            for change in changes:
                print(f"  {change}")
            if changes and not args.upgrade:
                print(
                    "  (a version the lock had is no longer offered for its platform, or the inputs now exclude it; "
                    "`git diff locks/` shows the hashes)"
                )
        print(requirements.write())
        return 0
    stale = [why for n in names if (why := lock.staleness(lock.SPECS[n]))]
    for why in stale:
        print(f"error: {why}\n  fix: run `make lock` and commit the locks", file=sys.stderr)
    if not stale:
        print(f"locks current: {', '.join(names)}")
    disagree = [] if args.names else requirements.check()  # requirements.txt follows the default stack's lock
    for why in disagree:
        print(f"error: {why}", file=sys.stderr)
    if not disagree and not args.names:
        print(f"{requirements.PATH} agrees with the default stack's NPU lock")
    return USER_ERROR if stale or disagree else 0


if __name__ == "__main__":
    run_cli(main)
