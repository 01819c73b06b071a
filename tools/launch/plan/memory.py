"""Device-memory estimate per rank for the actor, the reference and the rollout of a recipe.

An estimate from the architecture numbers (HF config names) and the parallel layout, phase by phase:
  actor update     actor weights + grads + optimizer states + activations (+ whatever else stays resident)
  reference        reference weights + forward working set for one log-prob micro-batch (+ resident rest)
  rollout          vLLM's pool (gpu_memory_utilization x capacity: weights, activations, KV cache)
                   + training state that is not offloaded during generation
Offload settings are honoured: param_offload/grad_offload move the Megatron weights/grads to the host
outside their phase; optimizer_offload or MindSpeed's swap_optimizer keep the optimizer states on the host
(the swap optimizer streams them through in chunks during the step; the chunk is not counted).

Byte counts (Megatron with verl 0.6.0's DDP settings, megatron_utils.py: grad_reduce_in_fp32=True):
  weights bf16 = 2 B/param; grads fp32 = 4 B/param; distributed Adam = 12 B/param (fp32 main copy,
  exp_avg, exp_avg_sq) divided over the data-parallel group of the parameter (dense: DP = world/(TP*PP*CP);
  experts: expert-DP = world/(ETP*EP*PP)).
Activations (bf16, flash attention, no sequence parallelism), after Korthikanti et al. 2022:
  one layer's working set       34 * s * b * h bytes  (+ MoE: s * b * topk * (2 * moe_ffn + h) * 2)
  full recompute keeps          s * b * h * 2 bytes per layer of the stage, for each micro-batch in flight
                                (1F1B: up to PP micro-batches on the first stage)
  logits for the log-probs      s * b * vocab / TP * 4 bytes (fp32), on the last stage
KV cache per token: MLA (latent + rope key) (kv_lora_rank + qk_rope_head_dim) * 2 B per layer, the same on
every TP rank; GQA 2 * ceil(kv_heads / TP) * head_dim * 2 B per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

GIB = 1024**3
GB = 1000**3


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


def layer_working_bytes(a: Arch, seq: int, mb: int) -> int:
    """One layer's forward/backward working set (bf16, flash attention), bytes."""
    n = 34 * seq * mb * a.hidden_size
    if a.moe:
        n += seq * mb * a.num_experts_per_tok * (2 * a.moe_intermediate_size + a.hidden_size) * 2
    return n


def logits_bytes(a: Arch, seq: int, mb: int, tp: int) -> int:
    return seq * mb * a.vocab_size // tp * 4


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


@dataclass
class Part:
    name: str
    bytes: int
    note: str = ""
    frees: tuple[str, ...] = ()  # a transient: the parts (by name) already freed when it is allocated


@dataclass
class Phase:
    """One phase on one rank: `parts` are held through the phase's main work (total); each transient
    is allocated at one moment of the phase (the optimizer step, the DDP wrap, a weight-sync bucket), on top
    of the parts not yet freed by then (peak)."""

    name: str
    parts: list[Part]
    capacity: int
    transients: list[Part] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(p.bytes for p in self.parts)

    def _at(self, t: Part) -> int:
        return self.total - sum(p.bytes for p in self.parts if p.name in t.frees) + t.bytes

    @property
    def peak(self) -> int:
        return max([self.total, *(self._at(t) for t in self.transients)])

    @property
    def peak_moment(self) -> str:
        best = max(self.transients, key=self._at, default=None)
        return best.name if best is not None and self._at(best) > self.total else "main work"

    @property
    def ratio(self) -> float:
        """The peak against the device (the resident total when nothing transient is modelled)."""
        return self.peak / self.capacity if self.capacity else math.inf


@dataclass
class Estimate:
    phases: list[Phase]
    stage_params: list[StageParams]
    worst_stage: int
    rollout_weights: int
    kv_needed: int
    kv_available: int
    notes: list[str]


def estimate(
    a: Arch,
    lay: Layout,
    *,
    capacity_bytes: int,
    seq: int,
    micro_batch: int,
    logprob_micro_batch: int,
    ref_logprob_micro_batch: int,
    param_offload: bool,
    grad_offload: bool,
    optimizer_on_host: bool,
    optimizer_offload: bool,
    ref_param_offload: bool,
    full_recompute: bool,
    rollout_tp: int,
    rollout_ep: int,
    gpu_memory_utilization: float,
    max_num_seqs: int,
    max_model_len: int,
    max_num_batched_tokens: int,
    npu: bool,
    device: str = "",
    swap_optimizer_times: int = 16,
    sync_bucket_bytes: int = 0,
) -> Estimate:
    stages = megatron_stage_params(a, lay)
    worst = max(stages, key=lambda s: s.total)  # the most parameters: weights-bound phases
    notes: list[str] = []

    def weights(sp: StageParams) -> int:
        return 2 * sp.total

    def grads(sp: StageParams) -> int:
        return 4 * sp.total

    def optim(sp: StageParams) -> int:
        return 12 * sp.dense // max(lay.dp, 1) + 12 * sp.expert // max(lay.expert_dp, 1)

    opt_note = (
        "on the host (swap optimizer)"
        if optimizer_on_host
        else f"distributed Adam 12 B/param over DP {lay.dp}"
        + (f" (experts: expert-DP {lay.expert_dp})" if a.moe else "")
    )

    def actor_phase(sp: StageParams) -> Phase:
        """The update phase on one pipeline stage: 1F1B keeps PP - stage micro-batches in flight."""
        n_layers = len(sp.layers)
        in_flight = max(1, lay.pp - sp.stage)
        if full_recompute:
            act = seq * micro_batch * a.hidden_size * 2 * n_layers * in_flight
            act += layer_working_bytes(a, seq, micro_batch)
            act_note = (
                f"{n_layers} checkpointed layer inputs x {in_flight} micro-batches + 1 layer working set"
            )
        else:
            act = layer_working_bytes(a, seq, micro_batch) * n_layers * in_flight
            act_note = f"{n_layers} layers x {in_flight} micro-batches in flight (no recompute)"
        is_last = sp.stage == len(stages) - 1
        return Phase(
            f"actor update (stage {sp.stage})",
            [
                Part("actor weights (bf16)", weights(sp), f"stage {sp.stage}: {sp.total / 1e9:.2f} B params"),
                Part("actor grads (fp32)", grads(sp), "grad_reduce_in_fp32"),
                Part("optimizer states", 0 if optimizer_on_host else optim(sp), opt_note),
                Part("activations", act, act_note),
                Part(
                    "logits (fp32)", logits_bytes(a, seq, micro_batch, lay.tp) if is_last else 0, "last stage"
                ),
            ],
            capacity_bytes,
            [optimizer_step(sp)],
        )

    def owned(sp: StageParams) -> int:
        """Parameters whose fp32 main copy and Adam states this rank's distributed optimizer holds."""
        return sp.dense // max(lay.dp, 1) + sp.expert // max(lay.expert_dp, 1)

    def optimizer_step(sp: StageParams) -> Part:
        """What the optimizer step allocates beyond the states, once activations and logits are freed."""
        frees = ("activations", "logits (fp32)")
        if npu and optimizer_on_host:
            chunk = 12 * owned(sp) // max(swap_optimizer_times, 1)
            return Part(
                "optimizer step: swap chunks", 2 * chunk,
                f"MindSpeed swap optimizer: fp32 param + exp_avg + exp_avg_sq of owned/{swap_optimizer_times} "
                "params on the device, 2 chunks in flight (one updating, one moving)", frees,
            )  # fmt: skip
        if npu:
            return Part(
                "optimizer step", 0, "MindSpeed's AdamW (npu_apply_fused_adamw_v2) updates in place", frees
            )
        if device == "cpu":
            big = min(largest_param(a, lay, sp), owned(sp))
            return Part(
                "optimizer step: AdamW temporaries", 2 * 4 * big,
                "torch AdamW's single-tensor path on CPU: sqrt and divide of the largest owned fp32 param", frees,
            )  # fmt: skip
        return Part(
            "optimizer step: AdamW fp32 copy", 4 * owned(sp),
            "torch AdamW's foreach path: one fp32 copy of every owned param (H200: +16.05 GiB measured, "
            "docs/plan-validation.md)", frees,
        )  # fmt: skip

    actor = max((actor_phase(sp) for sp in stages), key=lambda ph: ph.peak)

    resident_actor = [
        Part(
            "actor weights (resident)",
            0 if param_offload else weights(worst),
            "param_offload" if param_offload else "",
        ),
        Part(
            "actor grads (resident)",
            0 if grad_offload else grads(worst),
            "grad_offload" if grad_offload else "",
        ),
        Part(
            "optimizer states (resident)",
            0 if (optimizer_on_host or optimizer_offload) else optim(worst),
            "host" if (optimizer_on_host or optimizer_offload) else "",
        ),
    ]
    fwd_mb = max(logprob_micro_batch, ref_logprob_micro_batch)
    fwd = layer_working_bytes(a, seq, fwd_mb) // 2 + logits_bytes(a, seq, fwd_mb, lay.tp)
    ref = Phase(
        "reference / old log-prob",
        [
            Part("reference weights (bf16)", weights(worst), "the actor's layout"),
            *resident_actor,
            Part("forward working set", fwd, f"log-prob micro-batch {fwd_mb}, logits fp32"),
        ],
        capacity_bytes,
    )

    rollout_weights = rollout_params_per_rank(a, rollout_tp, rollout_ep) * 2
    derived = mla_derived_bytes(a, rollout_tp) if npu else 0
    pool = int(gpu_memory_utilization * capacity_bytes)
    act_reserve = max_num_batched_tokens * (a.hidden_size * 2 * 16 + a.vocab_size * 4 // rollout_tp)
    kv_available = pool - rollout_weights - derived - act_reserve
    kv_needed = max_num_seqs * max_model_len * kv_bytes_per_token(a, rollout_tp)
    rollout = Phase(
        "rollout (generation)",
        [
            Part("vLLM weights (bf16)", rollout_weights, f"TP{rollout_tp}, experts over EP{rollout_ep}"),
            Part("MLA derived W_UK_T/W_UV", derived, "vllm-ascend" if derived else ""),
            Part(
                "vLLM activations (profiled)", act_reserve, f"max_num_batched_tokens {max_num_batched_tokens}"
            ),
            Part(
                "KV cache (rest of the pool)",
                max(kv_available, 0),
                f"pool = {gpu_memory_utilization} x capacity",
            ),
            *resident_actor,
            Part(
                "reference weights (resident)",
                0 if ref_param_offload else weights(worst),
                "param_offload" if ref_param_offload else "",
            ),
        ],
        capacity_bytes,
    )
    start = Phase(
        "actor start-up (DDP wrap)",
        [
            Part("actor weights (bf16)", weights(worst), f"stage {worst.stage}"),
            Part("actor grads (fp32)", grads(worst), "DDP's grad buffer"),
        ],
        capacity_bytes,
        [
            Part(
                "DDP wrap: parameters copied into DDP's buffer",
                weights(worst),
                "the module's own parameters live until the copy ends (H200: +8 GiB measured)",
            )
        ],
    )
    sync = Phase(
        "weight sync (reshard)",
        [
            Part("vLLM weights (bf16)", rollout_weights, f"TP{rollout_tp}, experts over EP{rollout_ep}"),
            Part("MLA derived W_UK_T/W_UV", derived, "vllm-ascend" if derived else ""),
            Part("actor weights (onloaded for the export)", weights(worst), "load_megatron_model_to_gpu"),
            *resident_actor[1:],
            Part(
                "reference weights (resident)",
                0 if ref_param_offload else weights(worst),
                "param_offload" if ref_param_offload else "",
            ),
        ],
        capacity_bytes,
        [
            Part(
                "weight-sync bucket",
                sync_bucket_bytes,
                "rollout.update_weights_bucket_megabytes: gathered tensors handed to vLLM (KV cache not yet "
                "allocated)",
            )
        ],
    )
    return Estimate(
        [actor, ref, rollout, start, sync],
        stages,
        worst.stage,
        rollout_weights,
        kv_needed,
        kv_available,
        notes,
    )
