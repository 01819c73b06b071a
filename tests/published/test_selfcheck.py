"""`make selfcheck` on CPU: every CPU form passes on the patched trees, the NPU forms are listed, and a
broken patch behaviour makes the command fail (non-zero exit, FAIL rows)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.selfcheck import __main__ as selfcheck
from tools.selfcheck.result import FAIL, NEEDS_NPU, PASS

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.upstream, pytest.mark.slow]  # imports vLLM from the tree; forks 4 gloo ranks


def test_cpu_forms_pass_and_npu_forms_are_listed():
    # a fresh process, as `make selfcheck` runs it (the group check forks gloo ranks)
    proc = subprocess.run(
        [sys.executable, "-m", "tools.selfcheck", "--device", "cpu", "--times", "3"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout[proc.stdout.index("check ") :]
    rows = {line.split()[0] + " " + line.split()[1]: line for line in out.splitlines()[1:] if line.strip()}
    for name in selfcheck.CHECKS:
        assert f" {PASS} " in rows[f"{name} (cpu)"], rows[f"{name} (cpu)"]
        assert NEEDS_NPU in rows[f"{name} (npu)"]
    assert "3 re-creations" in out


def test_a_broken_mla_rebuild_fails_the_command(monkeypatch, capsys):
    selfcheck.env.put_trees_on_path()
    from verl.workers.rollout.npu import offload

    monkeypatch.setattr(offload.ManualOffloader, "rebuild_mla", lambda self: 0)  # stale W_UV/W_UK_T
    results = {r.check: r for r in selfcheck.run("cpu", None, times=2, world=4, tp=2)}
    assert results["mla-rebuild (cpu)"].result == FAIL
    assert results["offload-cycle (cpu)"].result == FAIL
    assert results["kv-recreate (cpu)"].result == PASS
    assert selfcheck.main(["--device", "cpu", "--times", "2"]) == 1
