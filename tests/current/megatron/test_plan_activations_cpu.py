"""The counted activation model against a live count: bench/plan_activation_count.py builds megatron-core
0.16.1's DeepSeek-V3 layers (local spec, flash-like attention and fused RMSNorm as their autograd
contracts) on CPU and counts every tensor autograd saves for the backward, once by storage, parameters
excluded; tools/plan/activations.py must give the same bytes for each layer, at widths, lengths,
micro-batches, expert counts and selective-recompute sets other than those it was written at
(docs/plan-validation.md). About 40 s, 1 GiB."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.megatron, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[3]
CONFIGS = [
    {"hidden": 320, "seq": 56, "mb": 2, "experts": 6, "topk": 3},
    {"hidden": 448, "seq": 36, "mb": 3, "experts": 8, "topk": 2, "modules": ["core_attn", "moe"]},
    {"hidden": 256, "seq": 80, "mb": 1, "experts": 4, "topk": 2, "modules": ["mla_up_proj", "mlp"]},
]


def test_the_formula_equals_the_live_hook_count_layer_by_layer():
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "plan_activation_count.py"), "--check", json.dumps(CONFIGS)],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(rows) == len(CONFIGS)
    for r in rows:
        assert r["counted"] and all(r["counted"]), r
        for counted, formula in zip(r["counted"], r["formula"], strict=True):
            assert formula == pytest.approx(counted, rel=0.01), r
