"""The weights verl hands its rollout from a Megatron actor at a parallel layout hold every routed expert,
each under its own global index: at PP2 x EP2 and at TP2 + SP x EP2 (ETP1), every rank's export of each
expert's gate projection equals the actor's own expert of that index.

Measured without the patch (2026-11-27, 2 cores): at PP2 x EP2 every rank exported 12 of the 24 experts'
weights (3 MoE layers x the 4 local experts), expert rank 1's under expert rank 0's indices, experts 4..7
never; at TP2 x EP2 each expert's fc1 came out (64, 64) instead of (32, 64), the two TP ranks' copies
stacked (`make train STACK=published RECIPE=tiny-cpu-parallel-tp` stopped on it in the HF rollout).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.published.parallel import test_layouts as TL

assets = TL.assets  # the recipe's tiny model and Megatron checkpoint, a module-scoped fixture

pytestmark = [pytest.mark.slow, pytest.mark.upstream, pytest.mark.megatron]
CHILD = Path(__file__).with_name("export_child.py")
REPO = Path(__file__).resolve().parents[3]
EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.gate_proj\.weight")


@pytest.mark.parametrize("layout", ["pp2ep2", "tp2sp"])
def test_every_rank_exports_every_expert_under_its_own_index(
    assets: Path, tmp_path: Path, layout: str
) -> None:
    world, tp, pp, ep, etp, sp = TL.LAYOUTS[layout]
    spec = {
        "name": layout, "layout": {"tp": tp, "pp": pp, "ep": ep, "etp": etp, "sp": sp}, "world": world,
        "port": TL._port(), "recipe": TL.RECIPE, "overrides": TL.layout_overrides(assets, world, tp, pp, ep, etp, sp),
        "out": str(tmp_path / layout),
    }  # fmt: skip
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"layouts": [spec], "report": str(tmp_path / "codes.json"), "timeout": 400}))
    r = subprocess.run(
        [sys.executable, str(CHILD), str(plan)], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    logs = "\n".join(
        p.read_text(errors="replace")[-3000:] for p in sorted((tmp_path / layout).glob("log*.txt"))
    )
    assert r.returncode == 0, r.stderr[-2000:] + logs
    ranks = [torch.load(p) for p in sorted((tmp_path / layout).glob("export*.pt"))]
    assert len(ranks) == world
    actor = {k: v for r in ranks for k, v in r["local"].items()}  # (layer number, global expert) -> fc1
    assert len(actor) == 3 * 8  # 3 MoE layers x 8 routed experts, each held by one expert rank
    for r in ranks:
        got = {}
        for name, tensor in r["exported"].items():
            m = EXPERT.fullmatch(name)
            got[(int(m[1]) + 1, int(m[2]))] = tensor
        assert sorted(got) == sorted(actor), f"rank {r['coords']}: exported experts {sorted(got)}"
        for key, fc1 in actor.items():
            gate = fc1[: fc1.shape[0] // 2]
            assert got[key].shape == gate.shape and torch.equal(
                got[key], gate
            ), f"rank {r['coords']['rank']}: expert {key} exported {tuple(got[key].shape)}, not the actor's"
