"""Seconds a GRPO step takes, phase by phase, from the recipe's layout, the hardware group and the expected
prompt/response lengths. The phases are verl's (timing_s/...):

  generate      vLLM: prefill of the prompts + decode with the KV cache, in waves of max_num_seqs
                sequences a rollout engine; a wave lasts as long as its longest response (the long tail);
                every decode step reads the engine's weights and the KV cache of its live sequences
  reshard       actor weights onloaded, gathered to every rollout rank and loaded into vLLM, offloaded
  reward        rule rewards on the CPU: seconds per response token
  old_log_prob  actor forward over every sequence (+ onload/offload of its weights)
  ref           reference forward over every sequence (+ onload/offload)
  update        actor forward + backward (+ recomputed forwards), 1F1B pipeline bubbles, MoE all-to-all,
                data-parallel gradient reduce-scatter + parameter all-gather, optimizer states through the
                host link (swap optimizer / optimizer offload), param/grad onload and offload
  other         the rest of the step (advantages, batch balancing, data movement): seconds per token

Every term is an ideal time from the chip's peak figures (tools/plan/hardware.py) divided by an
efficiency: a fitted factor for the dominant term of each phase (tools/plan/calibrate.py; the
shipped A3 factors come from the seed run), the peak link figure for the rest. See docs/plan-time.md.

Response lengths: tools/plan/lengths.py.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

from tools.plan import flops as F
from tools.plan import memory as M
from tools.plan.factors import PHASE_FIXED, PHASE_FIXED_OF, Factors
from tools.plan.hardware import Group
from tools.plan.lengths import Lengths

PHASES = ("generate", "reshard", "reward", "old_log_prob", "ref", "update", "other")
# ---- the setup a step runs with ----


@dataclass(frozen=True)
class Actor:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int = 1
    stages: tuple[int, ...] = ()
    micro_batch: int = 1
    logprob_micro_batch: int = 1
    ref_logprob_micro_batch: int = 1
    recompute_layers: int = 0  # layers a stage recomputes (full recompute); 0 = none
    param_offload: bool = False
    grad_offload: bool = False
    optimizer_offload: bool = False
    swap_optimizer: bool = False
    ref_param_offload: bool = False
    mini_batches: int = 1  # optimizer steps a training step (train batch / mini-batch x epochs)
    reference: bool = True  # a reference model (KL loss or KL in the reward)
    old_log_prob: bool = True  # the old log-prob pass runs (off: the update's own log-probs stand in)


@dataclass(frozen=True)
class Rollout:
    tp: int = 1
    ep: int = 1  # the expert-parallel group (1 = experts replicated in each TP group)
    max_num_seqs: int = 256
    kv_capacity_seqs: int | None = None  # sequences of the expected length the KV pool holds, when known
    reshard: str = "gather"  # gather: every rank receives the whole model (verl 0.6); shard: its own shard


@dataclass(frozen=True)
class Setup:
    arch: M.Arch
    group: Group
    actor: Actor
    rollout: Rollout
    prompts: int
    samples: int
    lengths: Lengths

    @property
    def sequences(self) -> int:
        return self.prompts * self.samples

    @property
    def tokens(self) -> float:
        return self.sequences * (self.lengths.prompt + self.lengths.response)

    def with_(self, **kw) -> Setup:
        return replace(self, **kw)


# ---- the terms ----


@dataclass
class Term:
    name: str
    seconds: float
    note: str = ""


@dataclass
class PhaseTime:
    name: str
    terms: list[Term] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.terms)

    def add(self, name: str, seconds: float, note: str = "") -> None:
        self.terms.append(Term(name, seconds, note))


@dataclass
class StepTime:
    phases: dict[str, PhaseTime]
    setup: Setup
    factors: Factors

    @property
    def step_s(self) -> float:
        return sum(p.seconds for p in self.phases.values())

    def seconds(self) -> dict[str, float]:
        return {k: p.seconds for k, p in self.phases.items()}

    @property
    def tokens_per_s_per_device(self) -> float:
        """Per rank (an NPU die: the unit the ranks count)."""
        return self.setup.tokens / self.step_s / self.setup.group.world

    @property
    def tokens_per_s_per_card(self) -> float:
        """Per card (an A3 package of 2 dies), as the published figures count."""
        return self.tokens_per_s_per_device * self.setup.group.dies_per_device

    def dominant(self) -> str:
        return max(self.phases.values(), key=lambda p: p.seconds).name


# ---- ideal work of each phase (shared with calibrate.py) ----


@dataclass(frozen=True)
class Work:
    """The ideal (peak-rate) seconds each fitted factor divides, and the fixed seconds beside them."""

    train_compute: float
    forward_compute: dict[str, float]  # old_log_prob, ref, prefill
    decode_memory: float
    reshard_link: float
    response_tokens: float
    tokens: float
    fixed: dict[str, list[Term]]
    layer_passes: dict[str, float] = field(default_factory=dict)  # old_log_prob, ref, update
    decode_collectives: float = 0.0  # node-leaving collectives over the whole decode
    notes: dict[str, str] = field(default_factory=dict)


def _stages(s: Setup) -> list[list[int]]:
    a, act = s.arch, s.actor
    counts = list(act.stages) or [a.num_hidden_layers // act.pp] * act.pp
    out, start = [], 0
    for n in counts:
        out.append(list(range(start, start + n)))
        start += n
    return out


@functools.lru_cache(maxsize=4096)
def _coeffs(a: M.Arch, first: int, count: int, last: bool) -> tuple[float, float]:
    """(FLOPs a token of the projections/MLPs, FLOPs a token-key pair of attention) of layers
    first..first+count-1 (+ the LM head when last): what one forward costs, from flops.py."""
    lin = core = 0.0
    for i in range(first, first + count):
        lf = F.layer_flops(a, i, 1, causal=False)
        lin += lf.attention_linear + lf.mlp
        core += lf.attention_core
    if last:
        lin += F.head_flops(a, 1)
    return lin, core


def _seq_flops(a: M.Arch, layers: list[int], last: bool, n_seq: float, mean: float, mean_sq: float) -> float:
    """Forward FLOPs of n_seq sequences through `layers` (+ the LM head when last), causal attention:
    projections scale with the mean length, attention cores with the mean of s(s+1)/2."""
    lin, core = _coeffs(a, layers[0] if layers else 0, len(layers), last)
    return n_seq * (lin * mean + core * (mean_sq + mean) / 2)


def _pipeline(pp: int, microbatches: float) -> float:
    """1F1B: (m + PP - 1) stage-times for m micro-batches."""
    m = max(microbatches, 1.0)
    return (m + pp - 1) / m


def _moe_layers(a: M.Arch, layers: list[int]) -> int:
    return _moe_count(a, layers[0] if layers else 0, len(layers))


@functools.lru_cache(maxsize=4096)
def _moe_count(a: M.Arch, first: int, count: int) -> int:
    return sum(1 for i in range(first, first + count) if a.is_moe_layer(i))


def _tp_allreduce(s: Setup, layers: list[int], passes: float) -> tuple[float, str]:
    """Seconds of Megatron's tensor-parallel all-reduces on one stage: two a layer a pass (after attention
    and after the MLP), each over the TP group's tokens x hidden (bf16), a ring moving 2(TP-1)/TP of it."""
    act, g = s.actor, s.group
    if act.tp <= 1:
        return 0.0, ""
    dp = g.world // (act.tp * act.pp)
    message = s.tokens / dp * s.arch.hidden_size * 2
    per = 2 * (act.tp - 1) / act.tp * message
    bw, link = g.link_bw(act.tp)
    return 2 * len(layers) * passes * per / bw, f"TP{act.tp} over {link} {bw / 1e9:.0f} GB/s"


def _alltoall(s: Setup, layers: list[int], passes: float) -> tuple[float, str]:
    """Seconds of the MoE token dispatch + combine on one stage: each pass moves every token's hidden
    state to its top-k experts and back (bf16), the (EP-1)/EP share leaving the rank."""
    a, act, g = s.arch, s.actor, s.group
    if not a.moe or act.ep <= 1:
        return 0.0, ""
    ranks_per_stage = g.world // act.pp
    tokens_per_rank = s.tokens / ranks_per_stage
    per_layer = 2 * tokens_per_rank * a.num_experts_per_tok * a.hidden_size * 2 * (act.ep - 1) / act.ep
    bw, link = g.link_bw(act.ep * act.tp, alltoall=True)
    return _moe_layers(a, layers) * per_layer * passes / bw, f"EP{act.ep} over {link} {bw / 1e9:.0f} GB/s"


def _stage_params(s: Setup) -> list[M.StageParams]:
    act = s.actor
    return _stage_params_of(
        s.arch, s.group.world, act.tp, act.pp, act.ep, act.etp, tuple(len(x) for x in _stages(s))
    )


@functools.lru_cache(maxsize=4096)
def _stage_params_of(a: M.Arch, world: int, tp: int, pp: int, ep: int, etp: int, stages: tuple[int, ...]):
    return M.megatron_stage_params(
        a, M.Layout(world=world, tp=tp, pp=pp, ep=ep, etp=etp, stages=list(stages))
    )


@functools.lru_cache(maxsize=1024)
def _rollout_bytes(a: M.Arch, tp: int, ep: int) -> int:
    return M.rollout_params_per_rank(a, tp, ep) * 2


@functools.lru_cache(maxsize=64)
def _model_bytes(a: M.Arch) -> int:
    return M.total_params(a) * 2


def work(s: Setup) -> Work:
    a, act, ro, g, ln = s.arch, s.actor, s.rollout, s.group, s.lengths
    chip = g.chip
    stages = _stages(s)
    n = s.sequences
    dp = g.world // (act.tp * act.pp)
    ranks_per_stage = g.world // act.pp
    fixed: dict[str, list[Term]] = {p: [] for p in PHASES}
    peak = chip.bf16_flops.value
    mean, mean_sq = ln.prompt + ln.response, ln.seq_sq()

    # update: the slowest stage, its share of every sequence's FLOPs over its ranks
    def stage_seconds(mult_of) -> list[float]:
        out = []
        for k, layers in enumerate(stages):
            fl = _seq_flops(a, layers, k == len(stages) - 1, n, mean, mean_sq) * mult_of(layers)
            out.append(fl / ranks_per_stage / peak)
        return out

    def recompute(layers: list[int]) -> float:
        return min(1.0, act.recompute_layers / max(len(layers), 1)) if act.recompute_layers else 0.0

    train = stage_seconds(lambda layers: F.train_multiplier(recompute(layers)))
    mb_per_rank = n / act.mini_batches / dp / max(act.micro_batch, 1)
    train_compute = max(train) * _pipeline(act.pp, mb_per_rank)
    slow = stages[train.index(max(train))]
    # launches: every micro-batch runs each layer of the slowest stage once forward, once backward (its
    # kernels about twice the forward's: input and weight gradients) and once more where recomputed;
    # 1F1B runs m + PP - 1 stage-steps a mini-batch
    layer_passes = {
        "update": act.mini_batches * (max(mb_per_rank, 1.0) + act.pp - 1) * len(slow) * (3 + recompute(slow))
    }
    sec, note = _alltoall(s, slow, passes=2 + recompute(slow))
    if sec:
        fixed["update"].append(Term("MoE all-to-all", sec, note))
    sec, note = _tp_allreduce(s, slow, passes=2 + recompute(slow))
    if sec:
        fixed["update"].append(Term("TP all-reduce", sec, note))
    sp = _stage_params(s)
    worst = max(sp, key=lambda x: x.total)
    edp = max(g.world // (act.etp * act.ep * act.pp), 1)
    if dp > 1 or edp > 1:
        dense_b = worst.dense * 6 * (dp - 1) / dp
        expert_b = worst.expert * 6 * (edp - 1) / edp
        bw_d, link_d = g.link_bw(g.world)
        fixed["update"].append(
            Term(
                "DP grad reduce-scatter + param all-gather",
                act.mini_batches * (dense_b + expert_b) / bw_d,
                f"fp32 grads + bf16 params over DP{dp} / expert-DP{edp}, {link_d}",
            )
        )
    opt_params = worst.dense / dp + worst.expert / edp
    if act.swap_optimizer or act.optimizer_offload:
        what = "swap optimizer" if act.swap_optimizer else "optimizer offload"
        fixed["update"].append(
            Term(
                f"optimizer states through the host ({what})",
                act.mini_batches * opt_params * 24 / chip.host_bw.value,
                "fp32 master + Adam m, v: 12 B/param in and out",
            )
        )
    host = 0.0
    if act.param_offload:
        host += worst.total * 2 * 2
    if act.grad_offload:
        host += worst.total * 4 * 2
    if host:
        fixed["update"].append(
            Term("param/grad onload + offload", host / chip.host_bw.value, "bf16 weights, fp32 grads")
        )

    # old_log_prob and ref: forward only
    fwd = stage_seconds(lambda layers: 1.0)
    forward_compute = {}
    for phase, mb, offload in (
        ("old_log_prob", act.logprob_micro_batch, act.param_offload),
        ("ref", act.ref_logprob_micro_batch, act.ref_param_offload),
    ):
        if (phase == "ref" and not act.reference) or (phase == "old_log_prob" and not act.old_log_prob):
            forward_compute[phase] = 0.0
            layer_passes[phase] = 0.0
            continue
        forward_compute[phase] = max(fwd) * _pipeline(act.pp, n / dp / max(mb, 1))
        layer_passes[phase] = (max(n / dp / max(mb, 1), 1.0) + act.pp - 1) * len(stages[fwd.index(max(fwd))])
        sec, note = _alltoall(s, stages[fwd.index(max(fwd))], passes=1)
        if sec:
            fixed[phase].append(Term("MoE all-to-all", sec, note))
        sec, note = _tp_allreduce(s, stages[fwd.index(max(fwd))], passes=1)
        if sec:
            fixed[phase].append(Term("TP all-reduce", sec, note))
        if offload:
            fixed[phase].append(
                Term("weights onload + offload", worst.total * 4 / chip.host_bw.value, "bf16, in and out")
            )

    # generate: prefill (forward FLOPs of the prompts) + decode (HBM reads)
    engines = max(g.world // ro.tp, 1)
    every = list(range(a.num_hidden_layers))
    forward_compute["prefill"] = _seq_flops(a, every, True, n, ln.prompt, ln.prompt**2) / g.world / peak
    per_engine = math.ceil(n / engines)
    conc = min(ro.max_num_seqs, per_engine, ro.kv_capacity_seqs or per_engine)
    conc = max(conc, 1)
    waves = math.ceil(per_engine / conc)
    weights = _rollout_bytes(a, ro.tp, max(ro.ep, 1))
    kv_tok = M.kv_bytes_per_token(a, ro.tp)
    steps = ln.longest_of(conc)
    kv_reads = conc * (ln.prompt * ln.response + ln.response_sq() / 2) * kv_tok
    decode_memory = waves * (steps * weights + kv_reads) / chip.hbm_bw.value
    if a.moe and ro.ep > ro.tp:  # every decoded token goes to its top-k experts over the EP group and back
        moe = _moe_count(a, 0, a.num_hidden_layers)
        tokens = waves * conc * ln.response / ro.tp
        moved = tokens * a.num_experts_per_tok * a.hidden_size * 2 * 2 * moe * (ro.ep - 1) / ro.ep
        bw, link = g.link_bw(ro.ep, alltoall=True)
        fixed["generate"].append(
            Term("MoE all-to-all (decode)", moved / bw, f"EP{ro.ep} over {link} {bw / 1e9:.0f} GB/s")
        )

    # decode latency: each decode step runs, on every layer, the collectives its engine needs; those that
    # leave the node (TP wider than a node: 2 all-reduces a layer; an EP group wider than the engine's TP
    # and than a node: dispatch + combine a MoE layer) cost a latency each, whatever their few bytes
    node = max(g.ranks_per_node, 1)
    per_step = 0
    if ro.tp > node:
        per_step += 2 * a.num_hidden_layers
    if a.moe and ro.ep > ro.tp and ro.ep > node:
        per_step += 2 * _moe_count(a, 0, a.num_hidden_layers)
    decode_collectives = waves * steps * per_step

    # reshard: every rank receives the whole model (verl gathers each tensor across PP/EP/TP), or on the
    # "shard" path only its own rollout shard
    total_bytes = _model_bytes(a) if ro.reshard != "shard" else _rollout_bytes(a, ro.tp, max(ro.ep, 1))
    bw_w, _ = g.link_bw(g.world)
    reshard_link = total_bytes / bw_w if g.world > 1 else total_bytes / chip.hbm_bw.value
    if act.param_offload:
        fixed["reshard"].append(
            Term("actor weights onload + offload", worst.total * 4 / chip.host_bw.value, "bf16, in and out")
        )

    return Work(
        train_compute=train_compute,
        forward_compute=forward_compute,
        decode_memory=decode_memory,
        reshard_link=reshard_link,
        response_tokens=n * ln.response,
        tokens=s.tokens,
        fixed=fixed,
        layer_passes=layer_passes,
        decode_collectives=decode_collectives,
        notes={
            "decode": f"{waves} wave(s) of {conc} sequences on each of {engines} engines, "
            f"longest response {steps:.0f} of {ln.response_max} tokens",
            "update": f"{act.mini_batches} optimizer step(s), {mb_per_rank:.0f} micro-batches a DP rank, "
            f"PP{act.pp} bubble x{_pipeline(act.pp, mb_per_rank):.2f}",
        },
    )


def step(s: Setup, f: Factors) -> StepTime:
    w = work(s)
    if s.group.chip.stack != f.stack:  # the fixed costs are the fitted stack's latencies, not this one's
        f = replace(f, layer_pass_s=0.0, decode_collective_s=0.0, **dict.fromkeys(PHASE_FIXED, 0.0))
    ph = {p: PhaseTime(p) for p in PHASES}
    ph["generate"].add("prefill", w.forward_compute["prefill"] / f.forward_mfu, "forward_mfu")
    ph["generate"].add("decode", w.decode_memory / f.decode_bw, w.notes["decode"])
    if w.decode_collectives and f.decode_collective_s:
        ph["generate"].add(
            "decode collectives leaving the node",
            w.decode_collectives * f.decode_collective_s,
            f"{w.decode_collectives:.3g} collectives x decode_collective_s",
        )
    ph["reshard"].add("weight gather + load", w.reshard_link / f.reshard_bw, "reshard_bw")
    ph["reward"].add("rule rewards", w.response_tokens * f.reward_s_per_token, "reward_s_per_token")
    ph["old_log_prob"].add("forward", w.forward_compute["old_log_prob"] / f.forward_mfu, "forward_mfu")
    ph["ref"].add("forward", w.forward_compute["ref"] / f.forward_mfu, "forward_mfu")
    ph["update"].add("forward + backward", w.train_compute / f.train_mfu, w.notes["update"])
    if f.layer_pass_s:
        for phase, count in w.layer_passes.items():
            if count:
                ph[phase].add(
                    "launches and host syncs",
                    count * f.layer_pass_s,
                    f"{count:.0f} layer passes x layer_pass_s",
                )
    ph["other"].add("advantages, balancing, transfers", w.tokens * f.other_s_per_token, "other_s_per_token")
    for phase, terms in w.fixed.items():
        ph[phase].terms.extend(terms)
    for phase, k in PHASE_FIXED_OF.items():
        sec = getattr(f, k)
        off = (phase == "ref" and not s.actor.reference) or (
            phase == "old_log_prob" and not s.actor.old_log_prob
        )
        if sec and not off:
            ph[phase].add("fixed a step", sec, k)
    return StepTime(ph, s, f)
