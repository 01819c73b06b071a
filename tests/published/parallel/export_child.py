"""verl's weight export to the rollout (`per_tensor_generator`, as the Megatron worker's `rollout_mode` calls
it) at a parallel layout, on gloo ranks; run by tests/published/parallel/test_expert_export.py.

    python export_child.py <plan.json>   # {"layouts": [spec, ...]}: layout_child.py's specs

Each rank saves <out>/export<rank>.pt: its coordinates, the routed experts' exported gate_proj weights
(HF names) and its own local experts' fc1 weights by (layer number, global expert index)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import layout_child as LC  # noqa: E402  (this folder's child, by path as the layout tests run it)


def export_rank(spec: dict, rank: int) -> None:
    arr, dp, rows = LC.rank_config(spec, rank)
    arr.actor.ppo_mini_batch_size = rows // dp
    LC.fp32_worker()
    from verl.models.mcore import get_mcore_weight_converter
    from verl.utils.megatron_utils import per_tensor_generator
    from verl.workers.megatron_workers import ActorRolloutRefWorker

    worker = ActorRolloutRefWorker(arr, role="actor")
    worker.init_model()
    coords, layers = LC.rank_coords(rank, worker.actor_module)
    # what init_model sets up beside the rollout (role actor builds none)
    names = {"qkv_layer_name": "self_attention.linear_qkv.", "gate_proj_layer_name": "linear_fc1."}
    converter = get_mcore_weight_converter(worker.actor_model_config, torch.float32)
    gen = per_tensor_generator(
        worker.actor.actor_module, worker.actor_model_config, converter, worker.tf_config, names
    )
    exported = {n: t.clone() for n, t in gen if ".mlp.experts." in n and n.endswith("gate_proj.weight")}
    local = {
        (int(layer.layer_number), int(g)): layer.mlp.experts.local_experts[i]
        .linear_fc1.weight.detach()
        .clone()
        for layer in layers
        if hasattr(layer.mlp, "local_expert_indices")
        for i, g in enumerate(layer.mlp.local_expert_indices)
    }
    torch.save(
        {"coords": coords, "exported": exported, "local": local}, Path(spec["out"]) / f"export{rank}.pt"
    )


if __name__ == "__main__":
    plan = json.loads(Path(sys.argv[1]).read_text())
    codes = {
        spec["name"]: LC.run_layout(spec, plan.get("timeout", 400), rank_fn=export_rank)
        for spec in plan["layouts"]
    }
    Path(plan["report"]).write_text(json.dumps(codes))
    sys.exit(0 if all(c == 0 for cs in codes.values() for c in cs) else 1)
