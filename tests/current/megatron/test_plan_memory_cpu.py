"""The planner's memory model against megatron-core 0.16.1 on CPU (bench/plan_memory_cpu.py, its narrow
part): DeepSeek-V3's layer shapes at hidden 1024, 1 dense + 1 MoE layer, 4 experts, megatron's DDP with
verl's settings (bf16, grad_reduce_in_fp32, distributed optimizer, Adam), one step, measured with torch's
MemTracker. Each component within 10% of the estimate, and what the forward keeps for the backward
(sequence 512, with and without full recompute) against memory.py's local-spec CPU terms
(docs/plan-validation.md has the figures).
About 30 s and 1.5 GiB (run it under the heavy lock)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.megatron, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[3]


def test_weights_grads_optimizer_ddp_wrap_step_and_activations_within_10_percent(tmp_path):
    out = tmp_path / "memory.json"
    subprocess.run(
        [sys.executable, str(REPO / "bench" / "plan_memory_cpu.py"), "--only", "narrow", "--out", str(out)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=600,
    )
    narrow = json.loads(out.read_text())["narrow"]
    checked = 0
    for name, row in narrow.items():
        if not isinstance(row, dict) or "measured" not in row:
            continue
        est = next(v for k, v in row.items() if k.startswith("estimate"))
        assert row["measured"] == pytest.approx(est, rel=0.10), (name, row)
        checked += 1
    assert checked == 7
