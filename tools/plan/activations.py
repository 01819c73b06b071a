"""What a decoder layer keeps for its backward on an accelerator, counted tensor by tensor: the activation
model memory.py uses for MLA layers on GPU and NPU groups.

Written from the storages autograd saves in megatron-core 0.16.1's DeepSeek-V3 layers (MLA + MoE), counted
with torch.autograd.graph.saved_tensors_hooks on CPU (bench/plan_activation_count.py: each storage once,
parameters excluded), with the two kernels a GPU or NPU fuses standing in as their autograd contracts:
flash attention keeps q, k, v, its output and the fp32 log-sum-exp (no [heads, s, s] scores), a fused
RMSNorm keeps its input and the fp32 rstd. Per token, bytes (bf16 = 2), T = seq x micro-batch tokens:

  input norm, pre-MLP norm     2 h + 4 each (the input, rstd)
  MLA down projections         2 h (the normed hidden state, shared by q and kv down)
  q latent                     q norm 2 lq + 4, q up-projection's input 2 lq
  kv latent                    kv norm 2 (lk + r) + 4 (its input is a view of the kv down output, latent
                               and rope key in one storage), kv up-projection's input 2 lk
  rotary                       cos and sin for q and for k: 4 x 2 r per position (not per micro-batch)
  core attention               q and k 2 n (qk + r) each, v 2 n dv (made contiguous: a copy), the output
                               2 n dv (linear_proj's input: the same storage), log-sum-exp 4 n
  dense SwiGLU MLP             fc1 input 2 h, fc1 output 4 ffn, silu output and product 2 ffn each, fc2
                               input 2 ffn: 2 h + 10 ffn
  router (sigmoid, top-k)      7 E + 18 k + 10 (fp32 scores, masks, indices, bf16 probabilities)
  token dispatcher             permuted tokens 2 k h, permuted probabilities 2 k, routing map and
                               indices 3 E + 8 k
  routed experts               12 moe_ffn per routed token (the SwiGLU's 10 + the probability-weighted
                               product), k routed tokens per token on average (balanced routing: EP does
                               not change a rank's share)
  shared experts               2 h + 10 x shared ffn
TP splits the heads and the FFNs (no sequence parallelism); the norms and latents stay whole.

Selective recompute (megatron's recompute_granularity "selective", recompute_modules; counted the same
way, every module alone): "core_attn" keeps q, k, v and the output (linear_proj's input) but not the
log-sum-exp (an int32 flag instead); "mla_up_proj" drops q, k, v (the latents stay) and keeps the rotary
frequencies (fp32, 4 r a position) instead of cos/sin; "mlp", "moe", "shared_experts" keep only their
input. Not counted, estimated as if not recomputed (an overestimate): "layernorm" (megatron-core 0.16.1's
CheckpointWithoutOutput asks Transformer Engine for its FP8 state and fails without it) and "moe_act"
(grouped GEMM only).
"""

from __future__ import annotations

from tools.plan.params import Arch

SELECTIVE_MODULES = ("core_attn", "mla_up_proj", "layernorm", "mlp", "moe", "shared_experts", "moe_act")


def korthikanti_layer_bytes(a: Arch, seq: int, mb: int) -> int:
    """Korthikanti et al. 2022's 34 s b h per layer (a GPT layer, fused attention) + the MoE term: the
    model the planner used before the count (GPU measurement: 0.65-0.81 of the real activations)."""
    n = 34 * seq * mb * a.hidden_size
    if a.moe:
        n += seq * mb * a.num_experts_per_tok * (2 * a.moe_intermediate_size + a.hidden_size) * 2
    return n


def saved_layer_parts(
    a: Arch, i: int, seq: int, mb: int, tp: int = 1, modules: tuple[str, ...] = ()
) -> dict[str, int]:
    """Layer i's saved tensors by component, bytes on one rank (TP splits heads and FFNs); modules: the
    selective-recompute modules (empty: no recompute)."""
    t, h = seq * mb, a.hidden_size
    n = max(a.num_attention_heads // tp, 1)
    qk, r, dv = a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim
    lq, lk = a.q_lora_rank or 0, a.kv_lora_rank
    sel = set(modules)
    norm_out = 2 * h  # a norm's output, kept by the linear after it ("layernorm" recompute: not counted)
    parts = {
        "norms (input, rstd)": t * (2 * h + 4) * 2,
        "MLA down-projection input": t * norm_out,
        "q latent (norm, up-projection input)": t * (4 * lq + 4) if lq else 0,
        "kv latent (norm, up-projection input)": t * (2 * (lk + r) + 4 + 2 * lk),
        "rotary cos/sin": (4 if "mla_up_proj" in sel else 8) * seq * r,
        "core attention q, k, v": 0 if "mla_up_proj" in sel else t * n * (4 * (qk + r) + 2 * dv),
        "core attention output": t * n * 2 * dv,
        "core attention log-sum-exp": 4 if "core_attn" in sel else t * n * 4,
    }
    if not a.is_moe_layer(i):
        ffn = a.intermediate_size // tp
        parts["dense MLP"] = t * norm_out if "mlp" in sel else t * (norm_out + 10 * ffn)
        return parts
    k, e, f = a.num_experts_per_tok, a.n_routed_experts, a.moe_intermediate_size
    fs = a.n_shared_experts * a.moe_intermediate_size // tp
    if "moe" in sel:  # the whole MoE block from its input
        parts["MoE (recomputed from its input)"] = t * norm_out
        return parts
    parts["router scores, masks, indices"] = t * (7 * e + 18 * k + 10)
    parts["dispatcher: permuted tokens, probabilities, routing map"] = t * (2 * k * h + 2 * k + 3 * e + 8 * k)
    parts["routed experts (SwiGLU x probabilities)"] = t * k * 12 * f
    if fs:
        parts["shared experts"] = t * norm_out if "shared_experts" in sel else t * (norm_out + 10 * fs)
    return parts


def saved_layer_bytes(a: Arch, i: int, seq: int, mb: int, tp: int = 1, modules: tuple[str, ...] = ()) -> int:
    return sum(saved_layer_parts(a, i, seq, mb, tp, modules).values())


def recompute_setting(otc: dict) -> tuple[bool, tuple[str, ...]]:
    """(full recompute?, the selective modules) from a recipe's override_transformer_config; ValueError
    naming the key for a setting megatron-core 0.16 refuses."""
    gran = otc.get("recompute_granularity")
    if gran in (None, "", "null"):
        return False, ()
    if gran == "full":
        return True, ()
    if gran != "selective":
        raise ValueError(
            f"override_transformer_config.recompute_granularity: {gran!r}; expected full, selective or null"
        )
    mods = otc.get("recompute_modules")
    mods = ["core_attn"] if mods is None else mods  # megatron-core's default
    if isinstance(mods, str) or not all(isinstance(m, str) for m in mods):
        raise ValueError(
            f"override_transformer_config.recompute_modules: {mods!r}; expected a list such as [core_attn]"
        )
    bad = sorted(set(mods) - set(SELECTIVE_MODULES))
    if bad:
        raise ValueError(
            f"override_transformer_config.recompute_modules: unknown {bad}; megatron-core 0.16 accepts "
            f"{list(SELECTIVE_MODULES)}"
        )
    return False, tuple(mods)


def activation_model(a: Arch, device: str, tp: int, full: bool, selective: tuple[str, ...]) -> str:
    """The name of the activation model memory.estimate uses for this architecture, device and setting."""
    if device == "cpu" and a.mla and tp == 1:
        how = "full recompute" if full else "no recompute"
        return f"local spec on CPU, counted (unfused attention), {how}"
    if full:
        return (
            "full recompute: checkpointed layer inputs + one layer's working set (Korthikanti; H200-checked)"
        )
    if not a.mla:
        return "no recompute: Korthikanti 34 s b h a layer (+ MoE term), not counted for this attention"
    if selective:
        return f"selective recompute {list(selective)}: each layer's saved tensors, counted (flash attention)"
    return "no recompute: each layer's saved tensors, counted (flash attention, fused norms)"
