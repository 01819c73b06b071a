"""The planner's memory model (tools/plan/memory.py) against megatron-core on CPU, component by
component: build DeepSeek-V3 layers (1 dense + 1 MoE) with megatron-core's local spec, measure what each
component really holds with torch's MemTracker, and compare with the estimate for the same architecture.

  weights, activations, logits  at DeepSeek-V3's full width (hidden 7168, MLA and FFN sizes as released),
                                4 experts, a short vocabulary and sequence (the model fits in a few GiB)
  grads, optimizer states,      at a narrower width (--narrow-hidden): megatron's DDP with the settings verl
  the DDP wrap, the step        uses (bf16, grad_reduce_in_fp32, distributed optimizer, Adam); 12 B/param of
                                optimizer state at full width would not fit this machine

Run it alone (it takes several GiB): flock /tmp/ascend-heavy.lock .venv-current-cpu/bin/python \
    bench/plan_memory_cpu.py --out build/plan-memory-cpu.json
The figures go into docs/plan-validation.md.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.tools.weights import megatron_cpu as MC  # noqa: E402
from tools.plan import memory as M  # noqa: E402

GIB = 1024**3

FULL = {  # DeepSeek-V3 (recipes/model/deepseek-v3-671b.yaml) with 2 layers, 4 experts, a short vocabulary
    "model_type": "deepseek_v3",
    "vocab_size": 16384,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 2,
    "first_k_dense_replace": 1,
    "num_attention_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "tie_word_embeddings": False,
    # what mcore_config reads beyond the planner's numbers
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "max_position_embeddings": 4096,
    "routed_scaling_factor": 2.5,
    "n_group": 1,
    "topk_group": 1,
    "rope_scaling": None,
}


def narrow(hidden: int) -> dict:
    """The same shape family at a smaller width (heads and FFN scaled with the hidden size)."""
    f = hidden / FULL["hidden_size"]
    return {
        **FULL,
        "hidden_size": hidden,
        "intermediate_size": int(FULL["intermediate_size"] * f),
        "moe_intermediate_size": int(FULL["moe_intermediate_size"] * f),
        "num_attention_heads": max(1, int(FULL["num_attention_heads"] * f)),
        "q_lora_rank": int(FULL["q_lora_rank"] * f),
        "kv_lora_rank": int(FULL["kv_lora_rank"] * f),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(hf: dict, recompute: bool):
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    config = MC.mcore_config(hf)
    config.params_dtype = torch.bfloat16
    config.bf16 = True
    config.pipeline_dtype = torch.bfloat16
    if recompute:  # the 671B recipe: full, block, every layer of the stage
        config.recompute_granularity = "full"
        config.recompute_method = "block"
        config.recompute_num_layers = hf["num_hidden_layers"]
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=hf["vocab_size"],
        max_sequence_length=hf["max_position_embeddings"],
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=False,
        position_embedding_type="rope",
    )


def peak_of(fn, *track) -> tuple[dict[str, int], object]:
    """Run fn under torch's MemTracker; the peak's bytes by category (PARAM, GRAD, ACT, TEMP, OPT...), and
    (as "end ACT") the activations still alive when fn returns."""
    from torch.distributed._tools.mem_tracker import MemTracker

    mt = MemTracker()
    if track:
        mt.track_external(*track)
    with mt:
        out = fn()
        end = mt.get_tracker_snapshot()[torch.device("cpu")]
    snap = mt.get_tracker_snapshot("peak")[torch.device("cpu")]
    peak = {str(k).split(".")[-1]: int(v) for k, v in snap.items()}
    peak["end ACT"] = int(next((v for k, v in end.items() if str(k).endswith("ACT")), 0))
    return peak, out


def logprob_loss(model, ids: torch.Tensor) -> torch.Tensor:
    """What verl's actor does with the logits: fp32 log-softmax, the taken tokens' log-probs."""
    pos = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    logits = model(ids, pos, attention_mask=None)  # [b, s, vocab] bf16
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, ids.unsqueeze(-1)).mean()


def kept_estimate(a: M.Arch, seq: int, recompute: bool) -> int:
    """What memory.py's CPU (local spec) terms say the forward leaves alive for the backward, one
    micro-batch, one stage: the checkpointed layer inputs (full recompute) or every layer's saved tensors,
    the scores buffer, the final norm and output layer's input, and the fp32 log-probs (the logits part)."""
    layers = range(a.num_hidden_layers)
    kept = (
        a.num_hidden_layers * seq * a.hidden_size * 2
        if recompute
        else sum(M.cpu_local_layer_bytes(a, i, seq, 1) for i in layers)
    )
    return kept + M.cpu_local_fixed_bytes(a, seq, 1, True) + M.logits_bytes(a, seq, 1, 1)


def activations(hf: dict, seq: int) -> dict:
    """ACT when the forward to the log-probs returns (MemTracker), with and without full recompute, against
    kept_estimate."""
    a = M.Arch.from_config(hf)
    out = {}
    for recompute in (False, True):
        model = build(hf, recompute)
        ids = torch.randint(0, hf["vocab_size"], (1, seq), generator=torch.Generator().manual_seed(0))
        fwd, _ = peak_of(lambda m=model, i=ids: logprob_loss(m, i), model)
        out[f"activations kept for the backward, {'full' if recompute else 'no'} recompute, seq {seq}"] = {
            "measured": fwd["end ACT"],
            "estimate (local spec, CPU)": kept_estimate(a, seq, recompute),
        }
        del model
    return out


def full_width(seq: int, recompute: bool) -> dict:
    hf = FULL
    a = M.Arch.from_config(hf)
    model = build(hf, recompute)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    sp = M.megatron_stage_params(a, M.Layout(world=1, stages=[2]))[0]
    ids = torch.randint(0, hf["vocab_size"], (1, seq), generator=torch.Generator().manual_seed(0))
    t = time.time()
    fwd, loss = peak_of(lambda: logprob_loss(model, ids), model)
    bwd, _ = peak_of(loss.backward, model)
    n = hf["num_hidden_layers"]
    if recompute:
        est_saved = seq * hf["hidden_size"] * 2 * n  # each layer's input, bf16
        est_bwd_act = est_saved + M.layer_working_bytes(a, seq, 1)
    else:
        est_saved = M.layer_working_bytes(a, seq, 1) * n
        est_bwd_act = est_saved
    attn_scores = (
        5 * hf["num_attention_heads"] * seq * seq * n
    )  # unfused attention (CPU): 5·a·s²·b bytes a layer
    return {
        "config": {k: hf[k] for k in ("hidden_size", "vocab_size", "n_routed_experts", "num_hidden_layers")},
        "seq": seq,
        "recompute": "full/block" if recompute else "none",
        "seconds": round(time.time() - t, 1),
        "weights": {"measured": weights, "estimate": 2 * sp.total},
        "forward peak": fwd,
        "backward peak": bwd,
        "activations kept for the backward (ACT when the forward returns, without the fp32 log-probs)": {
            "measured": fwd["end ACT"] - M.logits_bytes(a, seq, 1, 1),
            "estimate": est_saved,
            "estimate + unfused attention scores": est_saved + (0 if recompute else attn_scores),
            "estimate (local spec, CPU)": kept_estimate(a, seq, recompute) - M.logits_bytes(a, seq, 1, 1),
        },
        "logits fp32": {"estimate": M.logits_bytes(a, seq, 1, 1)},
        "backward working set (ACT + TEMP at the backward's peak)": {
            "measured": bwd.get("ACT", 0) + bwd.get("TEMP", 0),
            "estimate": est_bwd_act,
            "estimate + unfused attention scores + the largest weight's bf16 grad": est_bwd_act
            + attn_scores // n
            + 2 * M.largest_param(a, M.Layout(world=1, stages=[n]), sp),
        },
    }


def narrow_width(hidden: int) -> dict:
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    hf = narrow(hidden)
    a = M.Arch.from_config(hf)
    sp = M.megatron_stage_params(a, M.Layout(world=1, stages=[2]))[0]
    model = build(hf, recompute=True)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    wrap, ddp = peak_of(
        lambda: DistributedDataParallel(
            model.config,
            DistributedDataParallelConfig(use_distributed_optimizer=True, grad_reduce_in_fp32=True),
            model,
        ),
        model,
    )
    grads = sum(
        b.grad_data.numel() * b.grad_data.element_size() for b in [*ddp.buffers, *ddp.expert_parallel_buffers]
    )
    opt = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-4, bf16=True, use_distributed_optimizer=True, clip_grad=1.0),
        [ddp],
    )
    ids = torch.randint(0, hf["vocab_size"], (1, 256), generator=torch.Generator().manual_seed(0))
    ddp.zero_grad_buffer()
    logprob_loss(ddp, ids).backward()
    ddp.finish_grad_sync()
    inner = opt.optimizer if hasattr(opt, "optimizer") else opt
    mains = [p for g in inner.param_groups for p in g["params"]]
    step, _ = peak_of(opt.step, model, inner)
    states = sum(
        t.numel() * t.element_size()
        for s in inner.state.values()
        for t in s.values()
        if torch.is_tensor(t) and t.dim()
    )
    main_params = sum(p.numel() * p.element_size() for p in mains)
    lay = M.Layout(world=1, stages=[2])
    largest = M.largest_param(a, lay, sp)
    return {
        "config": {
            k: hf[k]
            for k in ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads")
        },
        "weights": {"measured": weights, "estimate": 2 * sp.total},
        "grads (DDP buffer, fp32)": {"measured": grads, "estimate": 4 * sp.total},
        "optimizer states (fp32 main + exp_avg + exp_avg_sq)": {
            "measured": main_params + states,
            "estimate": 12 * sp.total,
        },
        "DDP wrap transient (peak during the wrap - module buffers - weights - grad buffer)": {
            "measured": wrap["Total"] - wrap["BUFFER"] - weights - grads,
            "estimate": 2 * sp.total,
        },
        "optimizer step transient (peak during the step - module buffers - weights - grads - states)": {
            "measured": step["Total"] - step["BUFFER"] - weights - grads - main_params - states,
            "estimate (CPU: 2 x fp32 largest param)": 2 * 4 * largest,
        },
        "ddp wrap peak": wrap,
        "step peak": step,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--narrow-hidden", type=int, default=1024)
    ap.add_argument("--out", default=str(REPO / "build" / "plan-memory-cpu.json"))
    ap.add_argument("--only", choices=["full", "narrow"], default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    MC.apply_shims()
    MC.init_dist(0, 1, free_port(), 1, 1, 1)
    report: dict = {"torch": torch.__version__}
    if args.only in (None, "narrow"):
        report["narrow"] = narrow_width(args.narrow_hidden) | activations(
            narrow(args.narrow_hidden), args.seq
        )
    if args.only in (None, "full"):
        report["full, no recompute"] = full_width(args.seq, recompute=False)
        report["full, full recompute"] = full_width(args.seq, recompute=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
