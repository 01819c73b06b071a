"""The command line: user mistakes give one clear line and exit 1, never a traceback."""

from __future__ import annotations

import subprocess
import sys


def run(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.patches", *args], cwd=cwd, capture_output=True, text=True
    )


def test_unknown_upstream_is_a_clear_error(repo_root):
    proc = run("apply", "no-such-upstream", cwd=repo_root)
    assert proc.returncode == 2
    assert "unknown upstream no-such-upstream" in proc.stderr and "Traceback" not in proc.stderr
    from tools import stacks
    from tools.patches.config import load_upstreams

    names = ", ".join(load_upstreams(repo_root, stacks.resolve().name))  # the stack in use, in file order
    assert f"use one of: {names}" in proc.stderr


def test_rebase_without_ref_says_how(repo_root):
    proc = run("rebase", "verl", cwd=repo_root)
    assert proc.returncode == 2 and "make rebase-upstream UP=<name> REF=" in proc.stderr


def test_check_pins_passes_on_this_checkout(repo_root):
    proc = run("check-pins", cwd=repo_root)
    assert proc.returncode == 0, proc.stderr
