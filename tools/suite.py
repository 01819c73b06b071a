"""`make test` and `make verify-patch-tests`: one run per stack, each in that stack's own environment.

    python3 -m tools.suite test [--stack S] [--profile P] [pytest arguments ...]
    python3 -m tools.suite verify-patch-tests [--stack S] [--profile P] [verify-tests arguments ...]

Without --stack every stack whose environment (`.venv-<stack>-<profile>`) exists runs, the default first;
a stack that was never bootstrapped is named and skipped (`make bootstrap STACK=<name>` makes it). The
project's own tests (those outside tests/<stack>/) run in the first session only (tests/conftest.py).
Fails when any run fails, or when no stack has an environment; then the last lines name each failed test
and the first line of its failure, whatever scrolled past above (a CI log shows its tail).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from tools import cpu_kernels
from tools import stacks as st
from tools.errors import UserError, run_cli

REPO = Path(__file__).resolve().parents[1]
PYTEST_NO_TESTS = 5


def environments(stack: str | None, profile: str) -> list[tuple[st.Stack, Path]]:
    """(stack, python) of each stack to run: the one asked for, else every bootstrapped one, default first."""
    every = st.load(REPO)
    chosen = [st.resolve(stack, REPO)] if stack else sorted(every.values(), key=lambda s: not s.default)
    found = []
    for s in chosen:
        python = REPO / st.venv_name(s.name, profile) / "bin" / "python"
        if python.exists():
            found.append((s, python))
        elif stack:
            raise UserError(
                f"stack {s.name} has no {profile} environment ({python.parent.parent.name})",
                fix=f"run `make bootstrap STACK={s.name} PROFILE={profile}`",
            )
        else:
            print(f"stack {s.name}: not bootstrapped for {profile}, skipped (make bootstrap STACK={s.name})")
    if not found:
        raise UserError(
            f"no stack has a {profile} environment", fix="run `make bootstrap` (STACK= for another stack)"
        )
    return found


def command(what: str, python: Path, stack: str, extra: list[str], profile: str = "cpu") -> list[str]:
    if what == "test":
        return [str(python), "-m", "pytest", *extra]
    # the profile names the lock that the record's digests read (tools.patches.record)
    return [
        str(python),
        "-m",
        "tools.patches",
        "verify-tests",
        "--stack",
        stack,
        "--profile",
        profile,
        *extra,
    ]


def failures(junit_xml: Path) -> list[str]:
    """'<test id>: <first line of its failure or error>' for each test that failed in pytest's JUnit XML."""
    if not junit_xml.is_file():
        return []
    found = []
    for case in ET.parse(junit_xml).iter("testcase"):
        for bad in (*case.iter("failure"), *case.iter("error")):
            first = next((ln for ln in (bad.get("message") or bad.text or "").splitlines() if ln.strip()), "")
            found.append(f"{case.get('classname')}::{case.get('name')}: {first.strip()[:400]}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tools.suite", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("test", "verify-patch-tests"))
    parser.add_argument("--stack")
    parser.add_argument("--profile", choices=st.PROFILES)
    args, extra = parser.parse_known_args(argv)
    profile = args.profile or st.detect_profile()
    runs = environments(args.stack, profile)
    if args.what == "test":
        flags, native = cpu_kernels.this_machine("native")
        # which of vLLM's CPU kernel families the tests exercise here: this CPU's natively (the hand-over
        # tests, the learning guard); AMX_MLA's weight path also where AVX-512 BF16 is (forced selection)
        forced = " + AMX_MLA's weight path (forced)" if native.family == "avx512_bf16" else ""
        print(f"==== {native.line(flags, 'native')}; families exercised: {native.family}{forced}", flush=True)
    failed, why = [], []
    reports = Path(tempfile.mkdtemp(prefix="ascend-r1-suite-"))
    for i, (stack, python) in enumerate(runs):
        # the environment itself tells the session its stack (tools.stacks.resolve)
        env = {**os.environ, "ASCEND_R1_TEST_SHARED": "1" if i == 0 else "0"}
        env.pop(st.ENV_VAR, None)
        cmd = command(args.what, python, stack.name, extra, profile)
        junit = reports / f"{stack.name}.xml"
        if args.what == "test":
            cmd.append(f"--junitxml={junit}")
        print(f"==== stack {stack.name}: {' '.join(cmd)}", flush=True)
        start = time.monotonic()
        code = subprocess.run(cmd, cwd=REPO, env=env).returncode
        took = time.monotonic() - start
        if args.what == "test" and code == PYTEST_NO_TESTS and i > 0:
            code = 0  # this stack has no tests of its own yet; the shared ones ran in the first session
        print(
            f"==== stack {stack.name}: {'ok' if code == 0 else f'FAILED (exit {code})'} in {took:.0f}s",
            flush=True,
        )
        if code:
            failed.append(stack.name)
            why += [f"  {stack.name}: {line}" for line in failures(junit)]
    shutil.rmtree(reports, ignore_errors=True)
    if failed:
        print(f"error: {args.what} failed on stack {', '.join(failed)}", *why, sep="\n", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_cli(main)
