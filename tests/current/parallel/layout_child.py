"""verl 0.9.1's Megatron actor worker at parallel layouts, on gloo ranks; run by tests/current/parallel/test_layouts.py.

    python tests/current/parallel/layout_child.py <plan.json>

The plan, the forking of the ranks (imports paid once, in the parent), a rank's set-up (its environment, the
recipe's composed config, its coordinates and share of the model), the fixed batch and the steps each
layout takes are the published stack's (tests/published/parallel/layout_child.py: main, rank_config,
rank_coords, fixed_batch, run_steps); this file holds how a rank builds verl 0.9.1's worker, another class
with another data path, and calls it.

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

from tests.published.parallel.layout_child import (  # noqa: E402
    fixed_batch,
    main,
    rank_config,
    rank_coords,
    run_steps,
)

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
    arr, dp, rows = rank_config(spec, rank)

    fp32_worker()
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    t0 = time.time()
    worker = ActorRolloutRefWorker(arr, role="actor")
    worker.init_model()
    timings = {"init_model": time.time() - t0}
    engine = worker.actor.engine
    coords, layers = rank_coords(rank, engine.module)
    assert coords["dp_size"] == dp == engine.get_data_parallel_size(), coords
    assert coords["collect"] == bool(engine.is_mp_src_rank_with_outputs()), coords
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

    run_steps(spec, rank, dp, rows, coords, layers, worker, log_probs, update, timings)


if __name__ == "__main__":
    sys.exit(main(rank_fn=run_rank, preload="verl.workers.engine_workers"))
