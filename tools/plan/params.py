"""Parameter counts per rank from the architecture numbers (HF config.json names) and the parallel layout:
per layer (split by how megatron-core shards it), per pipeline stage, for vLLM's rollout ranks, and the
KV cache bytes a token takes. memory.py turns them into bytes per phase."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Arch:
    """Architecture numbers, HF config.json names (DeepSeek-V3 / Qwen2 families)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    moe_intermediate_size: int = 0
    first_k_dense_replace: int = 0
    n_routed_experts: int = 0
    n_shared_experts: int = 0
    num_experts_per_tok: int = 0
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    tie_word_embeddings: bool = False

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> Arch:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in cfg.items() if k in names})

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe(self) -> bool:
        return self.n_routed_experts > 0

    def is_moe_layer(self, i: int) -> bool:
        return self.moe and i >= self.first_k_dense_replace


@dataclass
class LayerParams:
    """Parameters of one decoder layer, split by how they are sharded."""

    tp_sharded: int = 0  # column/row-parallel linears (q_b, kv_b, o, qkv, dense MLP, shared experts)
    replicated: int = 0  # norms, MLA down-projections, the router
    expert: int = 0  # ONE routed expert (gate, up, down)
    n_experts: int = 0

    @property
    def total(self) -> int:
        return self.tp_sharded + self.replicated + self.expert * self.n_experts


def layer_params(a: Arch, i: int) -> LayerParams:
    h = a.hidden_size
    p = LayerParams(replicated=2 * h)  # input_layernorm + post_attention_layernorm
    if a.mla:
        qk_head = a.qk_nope_head_dim + a.qk_rope_head_dim
        if a.q_lora_rank:
            p.replicated += h * a.q_lora_rank + a.q_lora_rank  # q_a_proj + q_a_layernorm
            p.tp_sharded += a.q_lora_rank * a.num_attention_heads * qk_head  # q_b_proj
        else:
            p.tp_sharded += h * a.num_attention_heads * qk_head
        p.replicated += h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank  # kv_a_proj + norm
        p.tp_sharded += a.kv_lora_rank * a.num_attention_heads * (a.qk_nope_head_dim + a.v_head_dim)  # kv_b
        p.tp_sharded += a.num_attention_heads * a.v_head_dim * h  # o_proj
    else:
        hd = a.head_dim or h // a.num_attention_heads
        kv = a.num_key_value_heads or a.num_attention_heads
        q, k = a.num_attention_heads * hd, kv * hd
        p.tp_sharded += h * (q + 2 * k) + (q + 2 * k) + q * h  # qkv (+ Qwen2's qkv bias) + o
    if a.is_moe_layer(i):
        p.replicated += a.n_routed_experts * h + a.n_routed_experts  # router + expert score bias
        p.tp_sharded += a.n_shared_experts * 3 * h * a.moe_intermediate_size
        p.expert = 3 * h * a.moe_intermediate_size
        p.n_experts = a.n_routed_experts
    else:
        p.tp_sharded += 3 * h * a.intermediate_size  # gate, up, down
    return p


def embedding_params(a: Arch) -> int:
    return a.vocab_size * a.hidden_size


def total_params(a: Arch) -> int:
    head = 0 if a.tie_word_embeddings else embedding_params(a)
    return (
        embedding_params(a)
        + head
        + a.hidden_size
        + sum(layer_params(a, i).total for i in range(a.num_hidden_layers))
    )


def pipeline_layers(num_layers: int, pp: int, first: int | None, last: int | None) -> list[int] | None:
    """Megatron's per-stage layer counts (uneven first/last stage allowed); None when impossible."""
    if pp == 1:
        return [num_layers]
    first_n = first if first is not None else None
    last_n = last if last is not None else None
    rest_stages = pp - (first_n is not None) - (last_n is not None)
    rest_layers = num_layers - (first_n or 0) - (last_n or 0)
    if rest_stages == 0:
        return [first_n, last_n] if rest_layers == 0 else None
    if rest_layers < 0 or rest_layers % rest_stages:
        return None
    mid = [rest_layers // rest_stages] * rest_stages
    return ([first_n] if first_n is not None else []) + mid + ([last_n] if last_n is not None else [])


def stage_list(given: object) -> list[int]:
    """MindSpeed's per-stage layer list ([6, 8, ..., 7], or one list per stage of per-virtual-stage
    counts: [[6], [8], ...]) as the layer count of each pipeline stage. ValueError when malformed."""
    if not isinstance(given, list | tuple) or not given:
        raise ValueError(f"expected a list with one entry a pipeline stage, got {given!r}")
    out = []
    for entry in given:
        parts = entry if isinstance(entry, list | tuple) else [entry]
        if not parts or not all(isinstance(x, int) and not isinstance(x, bool) for x in parts):
            raise ValueError(f"entry {entry!r} is not a layer count (an integer, or a list of integers)")
        out.append(sum(parts))
    return out


@dataclass
class Layout:
    world: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    stages: list[int] = field(default_factory=list)

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp * self.cp)

    @property
    def expert_dp(self) -> int:
        return self.world // (self.etp * self.ep * self.pp)


@dataclass
class StageParams:
    """Parameters one rank holds for one pipeline stage."""

    stage: int
    layers: list[int]
    dense: int  # non-expert parameters on this rank
    expert: int  # routed-expert parameters on this rank

    @property
    def total(self) -> int:
        return self.dense + self.expert


def megatron_stage_params(a: Arch, lay: Layout) -> list[StageParams]:
    out, start = [], 0
    for s, n in enumerate(lay.stages):
        layers = list(range(start, start + n))
        start += n
        dense = expert = 0
        for i in layers:
            lp = layer_params(a, i)
            dense += lp.tp_sharded // lay.tp + lp.replicated
            if lp.n_experts:
                expert += (lp.n_experts // lay.ep) * (lp.expert // lay.etp)
        if s == 0:
            dense += embedding_params(a) // lay.tp
        if s == len(lay.stages) - 1:
            dense += a.hidden_size + (0 if a.tie_word_embeddings else embedding_params(a) // lay.tp)
        out.append(StageParams(s, layers, dense, expert))
    return out


def rollout_params_per_rank(a: Arch, tp: int, ep: int) -> int:
    """vLLM weights on one rank: TP-sharded linears / TP, replicated parts whole, experts over the EP group."""
    n = 2 * embedding_params(a) // tp if not a.tie_word_embeddings else embedding_params(a) // tp
    n += a.hidden_size
    for i in range(a.num_hidden_layers):
        lp = layer_params(a, i)
        n += lp.tp_sharded // tp + lp.replicated
        if lp.n_experts:
            n += math.ceil(lp.n_experts / ep) * lp.expert
    return n


def mla_derived_bytes(a: Arch, tp: int) -> int:
    """vllm-ascend's MLA keeps W_UK_T and W_UV, a bf16 copy of kv_b_proj per layer (per TP rank)."""
    if not a.mla:
        return 0
    kv_b = a.kv_lora_rank * a.num_attention_heads * (a.qk_nope_head_dim + a.v_head_dim)
    return a.num_hidden_layers * kv_b // tp * 2


def kv_bytes_per_token(a: Arch, tp: int) -> int:
    if a.mla:
        return (a.kv_lora_rank + a.qk_rope_head_dim) * 2 * a.num_hidden_layers
    hd = a.head_dim or a.hidden_size // a.num_attention_heads
    kv = a.num_key_value_heads or a.num_attention_heads
    return 2 * math.ceil(kv / tp) * hd * 2 * a.num_hidden_layers


def largest_param(a: Arch, lay: Layout, sp: StageParams) -> int:
    """Elements of the largest parameter tensor a rank holds on a stage (megatron-core's fused names)."""
    sizes = [0]
    if sp.stage == 0 or sp.stage == len(lay.stages) - 1:
        sizes.append(embedding_params(a) // lay.tp)
    for i in sp.layers:
        if a.mla:
            sizes.append(a.num_attention_heads * a.v_head_dim * a.hidden_size // lay.tp)  # linear_proj
            sizes.append((a.q_lora_rank or a.hidden_size) * a.num_attention_heads
                         * (a.qk_nope_head_dim + a.qk_rope_head_dim) // lay.tp)  # fmt: skip
        if a.is_moe_layer(i):
            sizes.append(2 * a.moe_intermediate_size * a.hidden_size // lay.etp)  # one expert's fc1
            sizes.append(2 * a.n_shared_experts * a.moe_intermediate_size * a.hidden_size // lay.tp)
        else:
            sizes.append(2 * a.intermediate_size * a.hidden_size // lay.tp)  # fc1 (gate and up fused)
    return max(sizes)
