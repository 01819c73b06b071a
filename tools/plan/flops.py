"""Matmul FLOPs of a decoder model, layer by layer, as Megatron (training, log-probs) and vLLM (prefill)
compute them. Only matrix products are counted (what `torch.utils.flop_counter.FlopCounterMode` counts:
mm, addmm, bmm, attention); norms, activations, softmax and rotary embeddings are elementwise and left out.

A product of an (m x k) and a (k x n) matrix is 2*m*k*n FLOPs. Per token of a sequence of length s:

  MLA (DeepSeek-V3, Megatron's multi_latent_attention: the keys and values are expanded from the latent,
  nothing absorbed during training)
    q         2*h*q_lora + 2*q_lora*heads*(nope+rope)        (no q_lora: 2*h*heads*(nope+rope))
    kv down   2*h*(kv_lora + rope)
    kv up     2*kv_lora*heads*(nope + v)
    scores    2*heads*(nope+rope)*s      (causal: the mean over positions, (s+1)/2 keys, not s)
    x values  2*heads*v*s                (causal likewise)
    out       2*heads*v*h
  GQA (Qwen2): qkv 2*h*(q + 2*kv), scores 2*heads*hd*s, x values 2*heads*hd*s, out 2*q*h
  dense MLP (SwiGLU)  6*h*ffn           gate, up, down
  MoE       router 2*h*experts + topk routed experts 6*h*moe_ffn*topk + shared 6*h*moe_ffn*n_shared
  LM head   2*h*vocab                   (the last pipeline stage; log-probs and the loss need all of it)

A backward pass costs two forwards (the gradient of the input and of the weight: two products of the same
size), so a training step without recompute is 3 forwards; full recompute adds one forward of every
recomputed layer. tests/tools/plan/test_plan_flops.py checks the per-layer counts against FlopCounterMode.
"""

from __future__ import annotations

from dataclasses import dataclass

from tools.plan.memory import Arch


def _attended(s: int, causal: bool) -> float:
    """Keys a query sees on average: s without a mask; (s+1)/2 under a causal mask (flash attention skips
    the masked half; FlopCounterMode counts a plain s x s product as s)."""
    return (s + 1) / 2 if causal else float(s)


@dataclass(frozen=True)
class LayerFlops:
    """Forward FLOPs of one layer for one sequence of s tokens, split by where the work runs."""

    attention_linear: float  # projections: scale with tokens
    attention_core: float  # scores and the weighted sum of values: scale with tokens x keys
    mlp: float  # dense MLP, or router + shared experts + routed experts
    routed: float  # the routed experts' part of mlp (runs on the expert-parallel group)

    @property
    def total(self) -> float:
        return self.attention_linear + self.attention_core + self.mlp


def attention_flops(a: Arch, s: int, causal: bool = True) -> tuple[float, float]:
    """(projection FLOPs, core FLOPs) of one attention layer's forward for a sequence of s tokens."""
    h, n = a.hidden_size, a.num_attention_heads
    keys = _attended(s, causal)
    if a.mla:
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        q = 2 * h * a.q_lora_rank + 2 * a.q_lora_rank * n * qk if a.q_lora_rank else 2 * h * n * qk
        kv = 2 * h * (a.kv_lora_rank + a.qk_rope_head_dim)
        kv += 2 * a.kv_lora_rank * n * (a.qk_nope_head_dim + a.v_head_dim)
        out = 2 * n * a.v_head_dim * h
        core = 2 * n * qk * keys + 2 * n * a.v_head_dim * keys
        return float(s * (q + kv + out)), s * core
    hd = a.head_dim or h // n
    kvh = a.num_key_value_heads or n
    proj = 2 * h * (n * hd + 2 * kvh * hd) + 2 * n * hd * h
    core = 2 * n * hd * keys * 2
    return float(s * proj), s * core


def mlp_flops(a: Arch, i: int, s: int) -> tuple[float, float]:
    """(all MLP FLOPs, the routed experts' share) of layer i's forward for s tokens."""
    h = a.hidden_size
    if not a.is_moe_layer(i):
        return float(s * 6 * h * a.intermediate_size), 0.0
    f = a.moe_intermediate_size
    routed = s * 6 * h * f * a.num_experts_per_tok
    other = s * (2 * h * a.n_routed_experts + 6 * h * f * a.n_shared_experts)
    return float(routed + other), float(routed)


def layer_flops(a: Arch, i: int, s: int, causal: bool = True) -> LayerFlops:
    lin, core = attention_flops(a, s, causal)
    mlp, routed = mlp_flops(a, i, s)
    return LayerFlops(lin, core, mlp, routed)


def head_flops(a: Arch, s: int) -> float:
    return float(s * 2 * a.hidden_size * a.vocab_size)


def forward_flops(a: Arch, s: int, causal: bool = True) -> float:
    """The whole model's forward for one sequence of s tokens (every layer + the LM head)."""
    return sum(layer_flops(a, i, s, causal).total for i in range(a.num_hidden_layers)) + head_flops(a, s)


def stage_forward_flops(a: Arch, layers: list[int], s: int, last: bool, causal: bool = True) -> float:
    """One pipeline stage's forward for one sequence: its layers (+ the LM head on the last stage)."""
    f = sum(layer_flops(a, i, s, causal).total for i in layers)
    return f + (head_flops(a, s) if last else 0.0)


def train_multiplier(recompute_fraction: float) -> float:
    """Forwards' worth of work in a training step: forward + backward (2) + the recomputed share."""
    return 3.0 + recompute_fraction


def active_params(a: Arch) -> float:
    """Parameters a token multiplies by (decode reads at least these), without the embedding lookup."""
    return (
        forward_flops(a, 1, causal=False)
        - sum(layer_flops(a, i, 1, causal=False).attention_core for i in range(a.num_hidden_layers))
    ) / 2
