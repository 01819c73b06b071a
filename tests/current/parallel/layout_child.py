"""verl 0.9.1's Megatron actor worker at parallel layouts, on gloo ranks; run by tests/current/parallel/test_layouts.py.

    python tests/current/parallel/layout_child.py <plan.json>

The plan, the forking of the ranks (imports paid once, in the parent), the fixed batch and the files written
are the published stack's (tests/published/parallel/layout_child.py: run_layout, fixed_batch, main); this
file holds what a rank does on the current stack, where verl's worker is another class with another data
path.

What runs is verl 0.9.1's own `ActorRolloutRefWorker` (verl/workers/engine_workers.py, role "actor": a
TrainingWorker over the Megatron engine, the model built through mbridge, the hf-to-mcore checkpoint loaded
with dist checkpointing, the distributed optimizer) built from the recipe's composed verl config, as verl's
trainer builds it on each rank, minus Ray. Each rank is given what verl's trainer and dispatch give it: the
padded batch's data-parallel share (chunk d of DP for data-parallel rank d; every pipeline/tensor rank of a
data-parallel group the same chunk), turned into verl's no-padding TensorDict (`left_right_2_no_padding`)
with the meta data `RayPPOTrainer._compute_old_log_prob` / `_update_actor` assign.

The one departure from the trainer, for the test's sake: parameters and optimizer in fp32 (verl 0.9.1's
engine config accepts bf16 or fp16 only), so that layouts can be compared to a tight tolerance.
"""

from __future__ import annotations

import os
import sys
import time

import torch

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, REPO)

from tests.published.parallel.layout_child import fixed_batch, main  # noqa: E402

METRICS = ("actor/pg_loss", "kl_loss", "grad_norm", "loss")


def fp32_worker() -> None:
    """verl 0.9.1's Megatron engine asserts dtype bfloat16 or float16 (McoreEngineConfig) and builds the
    model, mbridge's weights and the optimizer in that dtype; the equivalence tests compare in fp32 (the
    same code path with another dtype): every bf16 the engine asks for is fp32 here."""
    from verl.utils.torch_dtypes import PrecisionType

    to_dtype = PrecisionType.to_dtype
    PrecisionType.to_dtype = staticmethod(
        lambda p: torch.float32 if to_dtype(p) is torch.bfloat16 else to_dtype(p)
    )


def _plain(value):
    """A metric as the trainer logs it (verl's reduce_metrics: a Metric aggregated, a list as it is)."""
    from verl.utils.metric.utils import Metric

    if isinstance(value, Metric):
        return float(value.aggregate())
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value.item() if hasattr(value, "item") else value  # numpy scalars: plain numbers


def run_rank(spec: dict, rank: int) -> None:
    world = int(spec["world"])
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(spec["port"]), GLOO_SOCKET_IFNAME="lo",
        CUDA_VISIBLE_DEVICES="",
    )  # fmt: skip
    from omegaconf import OmegaConf

    from tools.launch.recipe import compose, compose_verl

    cfg = compose_verl(compose(spec["recipe"], spec["overrides"]))
    arr = cfg.actor_rollout_ref
    OmegaConf.set_struct(arr, False)
    layout = spec["layout"]
    dp = world // (layout["tp"] * layout["pp"])
    rows = int(spec.get("rows", 8))
    arr.actor.optim.lr = float(spec.get("lr", 1e-3))
    arr.actor.optim.total_training_steps = 10  # the trainer sets it from the data; constant lr anyway

    fp32_worker()
    from megatron.core import parallel_state as mpu
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.utils.megatron_utils import unwrap_model
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    t0 = time.time()
    worker = ActorRolloutRefWorker(arr, role="actor")
    worker.init_model()
    timings = {"init_model": time.time() - t0}
    engine = worker.actor.engine
    coords = {
        "rank": rank,
        "tp": mpu.get_tensor_model_parallel_rank(),
        "pp": mpu.get_pipeline_model_parallel_rank(),
        "ep": mpu.get_expert_model_parallel_rank(),
        "dp": mpu.get_data_parallel_rank(),
        "dp_size": mpu.get_data_parallel_world_size(),
        "collect": bool(engine.is_mp_src_rank_with_outputs()),
    }
    assert coords["dp_size"] == dp == engine.get_data_parallel_size(), coords
    assert coords["collect"] == (coords["tp"] == 0 and mpu.is_pipeline_last_stage()), coords
    # the share of the model this rank holds: its stage's (global, 1-based) layer numbers and the global
    # indices of its experts in each MoE layer
    model = unwrap_model(engine.module[0])
    layers = list(model.decoder.layers)
    coords["layers"] = [int(layer.layer_number) for layer in layers]
    coords["experts"] = {
        int(layer.layer_number): [int(i) for i in layer.mlp.local_expert_indices]
        for layer in layers
        if hasattr(layer.mlp, "local_expert_indices")
    }
    coords["params"] = sum(p.numel() for m in engine.module for p in m.parameters())
    coords["dtypes"] = sorted({str(p.dtype) for m in engine.module for p in m.parameters()})
    tensors = fixed_batch(worker.actor.model_config.hf_config.vocab_size, rows)
    prompt = tensors["input_ids"].shape[1] - tensors["responses"].shape[1]
    tensors["prompts"] = tensors["input_ids"][
        :, :prompt
    ]  # the rollout's output has it (no_padding_2_padding)
    full = DataProto.from_dict(tensors=tensors)
    share = full.chunk(dp)[coords["dp"]]

    def batch(**meta):
        """This rank's share as verl's trainer hands it over: padded DataProto -> no-padding TensorDict."""
        td = left_right_2_no_padding(share.to_tensordict())
        tu.assign_non_tensor(td, temperature=1.0, **meta)
        return td

    def log_probs() -> torch.Tensor | None:
        # RayPPOTrainer._compute_old_log_prob
        td = batch(calculate_entropy=True, compute_loss=False)
        out = worker.compute_log_prob(td)
        if out is None:
            return None
        return no_padding_2_padding(tu.get(out, "log_probs"), td).float() * share.batch["response_mask"]

    def update() -> dict | None:
        # RayPPOTrainer._update_actor: one mini-batch of the whole batch (rows), one epoch, in order
        td = batch(
            calculate_entropy=False,
            distillation_use_topk=False,
            distillation_only=False,
            global_batch_size=rows,
            mini_batch_size=rows,
            epochs=1,
            seed=arr.actor.data_loader_seed,
            dataloader_kwargs={"shuffle": False},
            compute_loss=True,
        )
        out = worker.update_actor(td)
        if out is None:
            return None
        m = tu.get(out, "metrics")
        return {k: _plain(m[k]) for k in METRICS if k in m}

    out: dict = {"coords": coords, "rows": torch.arange(rows).chunk(dp)[coords["dp"]].tolist()}
    path = os.path.join(spec["out"], f"rank{rank}.pt")

    def record(key: str, value) -> None:  # written as it goes: a later failure keeps what came before
        out[key] = value
        out["timings"] = timings
        torch.save(out, path)

    record("lp0", log_probs())
    # the tolerance catches a wrong layout: expert rank 1 swaps two of its experts of its first MoE layer
    # (what a hand-over that places a shard at the wrong index does), for one forward only
    moe = [layer.mlp for layer in layers if hasattr(layer.mlp, "local_expert_indices")]
    swap = coords["ep"] == 1 and bool(moe)
    if swap:
        a, b = (list(e.parameters()) for e in moe[0].experts.local_experts[:2])
        with torch.no_grad():
            for x, y in zip(a, b, strict=True):
                tmp = x.detach().clone()
                x.copy_(y)
                y.copy_(tmp)
    record("lpX", log_probs())
    if swap:
        with torch.no_grad():
            for x, y in zip(a, b, strict=True):
                tmp = x.detach().clone()
                x.copy_(y)
                y.copy_(tmp)
    record("m1", update())
    record("lp1", log_probs())
    if spec.get("save"):
        t = time.time()
        worker.save_checkpoint(spec["save"], global_step=1)
        timings["save"] = time.time() - t
    record("m2", update())
    record("lp2", log_probs())
    if spec.get("load"):
        t = time.time()
        worker.load_checkpoint(spec["load"], del_local_after_load=False)
        timings["load"] = time.time() - t
        record("lpR", log_probs())
        record("m2R", update())
        record("lp2R", log_probs())
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main(rank_fn=run_rank, preload="verl.workers.engine_workers"))
