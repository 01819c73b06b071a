"""What the backward keeps, counted: every tensor autograd saves in the forward of megatron-core's
DeepSeek-V3 layers (MLA + MoE) with a flash-like core attention (torch SDPA), deduplicated by storage
(a storage counts once, parameters not at all) and attributed to the layer and module that saved it.
The source of memory.py's GPU activation model (tools/plan/activations.py; docs/plan-validation.md).

    .venv-current-cpu/bin/python bench/plan_activation_count.py --hidden 256 --seq 64 --mb 2 \
        [--recompute none|selective] [--modules core_attn,mla_up_proj] [--rows]

The layer spec is megatron-core 0.16.1's local spec (the one the H200 measurement ran) with its core
attention replaced by torch's scaled_dot_product_attention, as a GPU without Transformer Engine would run
it: flash-like, no [heads, s, s] scores kept. The sizes are one layer's bytes, the embedding and output
layer are left out (the planner counts the logits apart).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import plan_memory_cpu as B  # noqa: E402

from tests.tools.weights import megatron_cpu as MC  # noqa: E402


class _FlashLike(torch.autograd.Function):
    """Causal attention that keeps what a flash kernel keeps for its backward (torch's flash and
    memory-efficient kernels, TE's and cuDNN's fused attention, MindSpeed's npu_fusion_attention): q, k, v,
    the output and the fp32 log-sum-exp, no [heads, s, s] scores. torch's own CPU flash kernel does that
    only when q and v have one head size; MLA's differ (192 and 128), where CPU SDPA falls back to the math
    path and keeps the fp32 scores. [s, b, n, d] in, [s, b, n * dv] out (the layout linear_proj takes)."""

    @staticmethod
    def forward(ctx, q, k, v, scale):
        qt, kt, vt = (t.permute(1, 2, 0, 3).float() for t in (q, k, v))
        scores = torch.matmul(qt, kt.transpose(-1, -2)) * scale
        s = q.shape[0]
        scores.masked_fill_(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)  # [b, n, s] fp32
        o = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), vt)  # [b, n, s, dv]
        out = o.permute(2, 0, 1, 3).reshape(s, q.shape[1], -1).to(q.dtype).contiguous()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _, _ = ctx.saved_tensors
        with torch.enable_grad():
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
            o = F.scaled_dot_product_attention(
                *(t.permute(1, 2, 0, 3) for t in (q, k, v)), is_causal=True, scale=ctx.scale
            )
            o = o.permute(2, 0, 1, 3).reshape(grad.shape)
            dq, dk, dv = torch.autograd.grad(o, (q, k, v), grad)
        return dq, dk, dv, None


class FlashAttention(torch.nn.Module):
    """megatron's core-attention interface over _FlashLike."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, softmax_scale=None, **_):
        super().__init__()
        self.softmax_scale = softmax_scale

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, **_):
        scale = self.softmax_scale or query.shape[-1] ** -0.5
        return _FlashLike.apply(query, key, value, scale)


class _FusedRMS(torch.autograd.Function):
    """RMSNorm that keeps what a fused kernel keeps (torch's CUDA _fused_rms_norm, TE's and Apex's
    RMSNorm, MindSpeed's npu_rms_norm): the input and the fp32 rstd. torch's CPU rms_norm is the
    composite, which keeps two fp32 copies of the input."""

    @staticmethod
    def forward(ctx, x, w, eps):
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, w, rstd)
        return (x.float() * rstd).to(x.dtype) * w

    @staticmethod
    def backward(ctx, grad):
        x, w, rstd = ctx.saved_tensors
        with torch.enable_grad():
            x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
            y = F.rms_norm(x, (x.shape[-1],), w, None)
            dx, dw = torch.autograd.grad(y, (x, w), grad)
        return dx, dw, None


class FusedRMSNorm(torch.nn.Module):
    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.eps = eps

    def forward(self, x):
        return _FusedRMS.apply(x, self.weight, self.eps)


def build(hf: dict, recompute: str, modules: list[str]):
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    config = MC.mcore_config(hf)
    config.params_dtype = torch.bfloat16
    config.bf16 = True
    config.pipeline_dtype = torch.bfloat16
    if recompute == "selective":
        config.recompute_granularity = "selective"
        config.recompute_modules = modules
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
    for layer in spec.layer_specs:
        sub, attn = layer.submodules, layer.submodules.self_attention.submodules
        attn.core_attention = FlashAttention
        sub.input_layernorm = sub.pre_mlp_layernorm = attn.q_layernorm = attn.kv_layernorm = FusedRMSNorm
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


def count(hf: dict, seq: int, mb: int, recompute: str = "none", modules: list[str] | None = None) -> dict:
    """{"layers": [bytes of layer 0, layer 1, ...], "rows": [(bytes, module, shape, dtype), ...]}: the
    storages saved for the backward inside each decoder layer, each counted once, parameters excluded."""
    model = build(hf, recompute, modules or [])
    model.train()
    stack = ["<top>"]

    def pre(name):
        return lambda m, a: stack.append(name)

    def post(m, a, o):
        stack.pop()

    for name, m in model.named_modules():
        m.register_forward_pre_hook(pre(name or "<model>"))
        m.register_forward_hook(post)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, tuple[torch.UntypedStorage, str, tuple, str]] = {}
    freed: list[tuple[torch.UntypedStorage, str, tuple, str]] = []

    def pack(t):
        st = t.untyped_storage()
        p = st.data_ptr()
        if p in seen and seen[p][0].data_ptr() != p:  # that storage was freed, its address reused
            freed.append(seen.pop(p))
        if p not in params and p not in seen and st.nbytes():
            seen[p] = (st, stack[-1], tuple(t.shape), str(t.dtype))
        return t

    ids = torch.randint(0, hf["vocab_size"], (mb, seq), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = B.logprob_loss(model, ids)
    # sizes when the forward has returned: selective recompute frees some outputs it saw saved (resized
    # to 0 by CheckpointWithoutOutput); what is left is what the backward starts from
    rows = sorted(
        ((st.nbytes(), w, sh, dt) for st, w, sh, dt in [*seen.values(), *freed] if st.nbytes()),
        key=lambda x: x[1],
    )
    loss.backward()
    layers = [0] * hf["num_hidden_layers"]
    for n, where, _, _ in rows:
        parts = where.split(".")
        if len(parts) > 2 and parts[0] == "decoder" and parts[1] == "layers":
            layers[int(parts[2])] += n
    return {"layers": layers, "rows": rows}


def config(hidden: int, experts: int = 4, topk: int = 2, layers: int = 2) -> dict:
    hf = B.FULL if hidden == B.FULL["hidden_size"] else B.narrow(hidden)
    return {**hf, "n_routed_experts": experts, "num_experts_per_tok": topk, "num_hidden_layers": layers}


def check(c: dict) -> dict:
    """One configuration counted and estimated: {"config", "counted": [per layer], "formula": [per layer]}."""
    from tools.plan import activations as A
    from tools.plan.params import Arch

    hf = config(c["hidden"], c.get("experts", 4), c.get("topk", 2))
    mods = tuple(c.get("modules", ()))
    out = count(hf, c["seq"], c["mb"], "selective" if mods else "none", list(mods))
    a = Arch.from_config(hf)
    formula = [A.saved_layer_bytes(a, i, c["seq"], c["mb"], 1, mods) for i in range(a.num_hidden_layers)]
    return {"config": c, "counted": out["layers"], "formula": formula}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--mb", type=int, default=1)
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--recompute", choices=["none", "selective"], default="none")
    ap.add_argument("--modules", default="core_attn", help="selective recompute modules, comma-separated")
    ap.add_argument("--rows", action="store_true", help="list every saved storage")
    ap.add_argument(
        "--check",
        metavar="JSON",
        help='a list of configurations [{"hidden":..,"seq":..,"mb":..,"experts":..,"topk":..,"modules":[..]}]: '
        "count each and print it beside activations.saved_layer_bytes (one process)",
    )
    args = ap.parse_args()
    torch.set_num_threads(2)
    MC.apply_shims()
    MC.init_dist(0, 1, B.free_port(), 1, 1, 1)
    if args.check:
        print(json.dumps([check(c) for c in json.loads(args.check)]))
        torch.distributed.destroy_process_group()
        return 0
    hf = config(args.hidden, args.experts, args.topk)
    modules = args.modules.split(",")
    out = count(hf, args.seq, args.mb, args.recompute, modules)
    if args.rows:
        for n, where, shape, dtype in out["rows"]:
            print(f"{n:>12}  {where:60} {shape} {dtype}")
    print(json.dumps({"config": vars(args), "layers": out["layers"]}))
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
