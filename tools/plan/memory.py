"""Device-memory estimate per rank for each phase of a step: what stays resident and the peak.

An estimate from the architecture numbers (HF config names) and the parallel layout, phase by phase:
  actor update     actor weights + grads + optimizer states + activations (+ whatever else stays resident)
  reference        reference weights + forward working set for one log-prob micro-batch (+ resident rest)
  rollout          vLLM's pool (gpu_memory_utilization x capacity: weights, activations, KV cache)
                   + training state that is not offloaded during generation
  start-up         actor weights + DDP's grad buffer
  weight sync      vLLM's weights + the actor's weights (loaded back for the export) + resident rest
Offload settings are honoured: param_offload/grad_offload move the Megatron weights/grads to the host
outside their phase (verl's load_megatron_model_to_gpu resizes each buffer in place and copies into it:
no device-side staging copy); optimizer_offload or MindSpeed's swap_optimizer keep the optimizer states
on the host.

Transients, each at one moment of its phase (Phase.peak = the parts still held then + the transient):
  optimizer step   after the backward (activations and logits freed), by the optimizer the stack uses:
                   CUDA torch AdamW (foreach): one fp32 copy of every owned param, 4 B/param (measured on
                   an H200: +16.05 GiB); CPU torch AdamW (single-tensor): sqrt and divide of the largest
                   owned param, 2 x 4 B x its elements; NPU MindSpeed AdamW (npu_apply_fused_adamw_v2):
                   in place, 0; NPU swap optimizer: fp32 param + exp_avg + exp_avg_sq of
                   owned / swap_optimizer_times params (MindSpeed's default 16), two chunks in flight
  DDP wrap         megatron's DDP copies the parameters into its contiguous buffer while the module's own
                   parameters live: + the weights once (H200: +8 GiB)
  weight sync      one bucket of gathered tensors (rollout update_weights_bucket_megabytes)
docs/plan-validation.md compares each component with measurements (CPU, and the H200 figures).

Byte counts (Megatron with verl 0.6.0's DDP settings, megatron_utils.py: grad_reduce_in_fp32=True):
  weights bf16 = 2 B/param; grads fp32 = 4 B/param; distributed Adam = 12 B/param (fp32 main copy,
  exp_avg, exp_avg_sq) divided over the data-parallel group of the parameter (dense: DP = world/(TP*PP*CP);
  experts: expert-DP = world/(ETP*EP*PP)).
Activations (bf16, flash attention, no sequence parallelism), by the recipe's recompute setting
(override_transformer_config.recompute_granularity / recompute_modules; activations.activation_model names
the model chosen, `make plan` prints it):
  none or selective, MLA        every layer's saved tensors, counted (activations.saved_layer_bytes: MLA's
                                latents, rotary, flash attention's q/k/v/output/lse, router, dispatcher,
                                experts, norms), x the micro-batches in flight (1F1B: up to PP on stage 0)
  none, other attention         Korthikanti et al. 2022: 34 * s * b * h bytes a layer (+ MoE term) (not counted)
  full recompute keeps          s * b * h * 2 bytes per layer of the stage, for each micro-batch in flight,
                                + one layer's working set (Korthikanti; H200: within 1% of the peak)
  CPU (local spec, MLA, TP1)    cpu_local_layer_bytes / cpu_local_fixed_bytes (unfused attention, counted)
  logits for the log-probs      s * b * vocab / TP * 4 bytes (fp32), on the last stage
KV cache per token: MLA (latent + rope key) (kv_lora_rank + qk_rope_head_dim) * 2 B per layer, the same on
every TP rank; GQA 2 * ceil(kv_heads / TP) * head_dim * 2 B per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tools.plan import activations as A
from tools.plan.params import (  # the parameter counts, here for the callers of memory.M
    Arch,
    LayerParams,
    Layout,
    StageParams,
    embedding_params,
    kv_bytes_per_token,
    largest_param,
    layer_params,
    megatron_stage_params,
    mla_derived_bytes,
    pipeline_layers,
    rollout_params_per_rank,
    stage_list,
    total_params,
)

__all__ = [
    "GB", "GIB", "Arch", "Estimate", "LayerParams", "Layout", "Part", "Phase", "StageParams", "embedding_params",
    "cpu_local_fixed_bytes", "cpu_local_layer_bytes", "estimate", "kv_bytes_per_token", "largest_param", "layer_params", "layer_working_bytes", "logits_bytes",
    "megatron_stage_params", "mla_derived_bytes", "pipeline_layers", "rollout_params_per_rank", "stage_list",
    "total_params",
]  # fmt: skip

GIB = 1024**3
GB = 1000**3


def layer_working_bytes(a: Arch, seq: int, mb: int) -> int:
    """One layer's forward/backward working set (bf16, flash attention), bytes: Korthikanti's 34 s b h + the
    MoE term. With full recompute it is the recomputed layer's share of the backward's peak (within 1% on
    the H200); the layers' saved tensors without recompute are activations.saved_layer_bytes."""
    return A.korthikanti_layer_bytes(a, seq, mb)


def cpu_local_layer_bytes(a: Arch, i: int, seq: int, mb: int) -> int:
    """What one MLA layer of megatron-core's local spec (the CPU path: unfused attention, torch RMSNorm)
    keeps for the backward, bytes, TP1. Counted tensor by tensor from autograd's saved tensors
    (bench/plan_memory_inventory.py lists them):
      each RMSNorm (input, pre-MLP, q and kv latents)  two fp32 copies of its input + fp32 rstd: 8 w + 4
      the linears' bf16 inputs                         hidden (q and kv down share it), q latent, kv latent,
                                                       the attention context (heads x v)
      rope                                             4 bf16 (s, r) pieces
      unfused attention                                q and k (heads x (qk + r)), v, softmax in fp32 and
                                                       bf16 (6 B a head a score), the causal mask (1 B a score)
      dense SwiGLU MLP                                 input + fc1 output (2 ffn) + 2 halves + fc2 input: 2 h + 10 ffn
      MoE                                              permuted tokens (top-k x h), each routed copy's SwiGLU
                                                       (10 moe_ffn), the shared experts', router tensors
    (per token, x 2 B unless said)."""
    s, h, n = seq * mb, a.hidden_size, a.num_attention_heads
    qk, r, dv = a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim
    lq, lk = a.q_lora_rank or 0, a.kv_lora_rank

    def norm(w: int) -> int:
        return 8 * s * w + 4 * s

    attn = norm(h) + 2 * s * h + 2 * s * lk + norm(lk) + 8 * s * r
    if lq:
        attn += norm(lq) + 2 * s * lq
    attn += 2 * 2 * n * s * (qk + r) + 2 * n * s * dv + 6 * n * s * seq + s * seq + 2 * s * n * dv
    attn += norm(h)  # pre-MLP norm
    if a.is_moe_layer(i):
        k, f, e = a.num_experts_per_tok, a.moe_intermediate_size, a.n_routed_experts
        mlp = 2 * s * k * h + 10 * s * k * f + a.n_shared_experts * 10 * s * f + 2 * s * h
        mlp += 10 * s * e + 28 * s * k + 10 * s  # router logits, probabilities, masks, indices
    else:
        mlp = 2 * s * h + 10 * s * a.intermediate_size
    return attn + mlp


def cpu_local_fixed_bytes(a: Arch, seq: int, mb: int, last: bool) -> int:
    """Beside the layers on the local spec: megatron's global memory buffer, into which unfused attention
    writes its scores (bf16, heads x s x s, one buffer reused by every layer, alive from the first
    forward on), and on the last stage the final norm and the output layer's bf16 input (the fp32
    log-probs are the logits part)."""
    out = 2 * mb * a.num_attention_heads * seq * seq
    if last:
        s = seq * mb
        out += 8 * s * a.hidden_size + 4 * s + 2 * s * a.hidden_size + 8 * s
    return out


def logits_bytes(a: Arch, seq: int, mb: int, tp: int) -> int:
    return seq * mb * a.vocab_size // tp * 4


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
    activation_model: str = ""


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
    selective: tuple[str, ...] = (),
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
    model = A.activation_model(a, device, lay.tp, full_recompute, selective)
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
        is_last = sp.stage == len(stages) - 1
        if device == "cpu" and a.mla and lay.tp == 1:  # megatron-core's local spec, as measured on CPU
            per = [cpu_local_layer_bytes(a, i, seq, micro_batch) for i in sp.layers]
            fixed = cpu_local_fixed_bytes(a, seq, micro_batch, is_last)
            if full_recompute:
                act = (
                    seq * micro_batch * a.hidden_size * 2 * n_layers * in_flight + max(per, default=0) + fixed
                )
                act_note = (
                    f"{n_layers} checkpointed layer inputs x {in_flight} micro-batches + 1 layer's saved "
                    "tensors + the scores buffer (local spec, CPU)"
                )
            else:
                act = sum(per) * in_flight + fixed
                act_note = (
                    f"{n_layers} layers' saved tensors x {in_flight} micro-batches + the scores buffer (CPU)"
                )
        elif full_recompute:
            act = seq * micro_batch * a.hidden_size * 2 * n_layers * in_flight
            act += layer_working_bytes(a, seq, micro_batch)
            act_note = (
                f"{n_layers} checkpointed layer inputs x {in_flight} micro-batches + 1 layer working set"
            )
        elif a.mla:  # counted: what each MLA layer saves (tools/plan/activations.py)
            per = [A.saved_layer_bytes(a, i, seq, micro_batch, lay.tp, selective) for i in sp.layers]
            act = sum(per) * in_flight
            act_note = f"{n_layers} layers' saved tensors (counted) x {in_flight} micro-batches in flight"
        else:
            act = layer_working_bytes(a, seq, micro_batch) * n_layers * in_flight
            act_note = f"{n_layers} layers x {in_flight} micro-batches in flight (no recompute)"
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
        model,
    )
