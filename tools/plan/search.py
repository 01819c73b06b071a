"""`make plan RECIPE=<r> SEARCH=1`: the fastest layouts for the recipe's nodes.

Enumerates, for the recipe's model, batch and hardware group:
  actor     TP (divides heads and ranks, at most a node), PP (with the two best-balanced first/last-stage
            splits), EP (divides the experts and ranks / (ETP x PP)), ETP in {1, TP}, micro-batch 1/2/4,
            full recompute or none, param+grad offload on/off, optimizer states on the device / through
            the swap optimizer (NPU) / offloaded
  rollout   TP (divides heads, at most a node) with DP = ranks / TP, experts over the whole DP x TP group
            (EP) or TP-sharded, max_num_seqs as the recipe or covering an engine's sequences
Each actor candidate and each rollout candidate is timed once (timing.py); pairs are visited fastest
first and kept only when the memory model (memory.py: every phase within the device, room for a KV
cache) says they fit, until five are found. The micro-batch only moves pipeline bubbles and memory here:
the model has no kernel-efficiency gain for larger micro-batches, so it prefers small ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from omegaconf import DictConfig, OmegaConf

from tools.plan import factors as F
from tools.plan import memory as M
from tools.plan import timing as T

TOP = 5


@dataclass(frozen=True)
class Candidate:
    actor: T.Actor
    rollout: T.Rollout
    step_s: float
    phases: dict[str, float]
    dominant: str
    peak: float  # the fullest phase, as a fraction of the device


@dataclass
class Result:
    recipe: Candidate | None  # the recipe's own layout (None when it does not fit)
    recipe_fits: bool
    top: list[Candidate]
    actors: int
    rollouts: int
    checked: int  # pairs the memory model was asked about

    def lines(self, base: T.Setup) -> list[str]:
        out = [
            f"searched {self.actors} actor x {self.rollouts} rollout layouts; "
            f"memory checked for {self.checked} pairs, fastest first"
        ]
        if self.recipe:
            out.append(
                f"recipe's layout: {self.recipe.step_s:.1f} s a step"
                + ("" if self.recipe_fits else " (does NOT fit the device)")
            )
        for i, c in enumerate(self.top, 1):
            tps = base.tokens / c.step_s / base.group.world
            out.append(
                f"{i}. {c.step_s:8.1f} s  {tps:7.1f} tokens/s a device  dominant {c.dominant}, "
                f"memory peak {c.peak:.0%}  {describe(c)}"
            )
            out.append(f"   change from the recipe: {changes(base, c) or 'none (the recipe layout)'}")
        if not self.top:
            out.append("no layout fits the device: more nodes, or a shorter response cap")
        return out


def describe(c: Candidate) -> str:
    a, r = c.actor, c.rollout
    opt = "swap" if a.swap_optimizer else "offload" if a.optimizer_offload else "device"
    return (
        f"actor TP{a.tp} PP{a.pp} EP{a.ep} ETP{a.etp} stages {list(a.stages)} mb{a.micro_batch} "
        f"recompute {'full' if a.recompute_layers else 'none'} offload {'on' if a.param_offload else 'off'} "
        f"optimizer {opt}; rollout TP{r.tp} EP{r.ep} max_num_seqs {r.max_num_seqs}"
    )


def changes(base: T.Setup, c: Candidate) -> str:
    a0, r0, a, r = base.actor, base.rollout, c.actor, c.rollout
    out = []
    for name, x, y in (
        ("actor TP", a0.tp, a.tp),
        ("PP", a0.pp, a.pp),
        ("EP", a0.ep, a.ep),
        ("ETP", a0.etp, a.etp),
        ("stages", list(a0.stages), list(a.stages)),
        ("micro-batch", a0.micro_batch, a.micro_batch),
        ("recompute", "full" if a0.recompute_layers else "none", "full" if a.recompute_layers else "none"),
        ("param/grad offload", a0.param_offload, a.param_offload),
        ("swap optimizer", a0.swap_optimizer, a.swap_optimizer),
        ("optimizer offload", a0.optimizer_offload, a.optimizer_offload),
        ("rollout TP", r0.tp, r.tp),
        ("rollout EP", r0.ep, r.ep),
        ("max_num_seqs", r0.max_num_seqs, r.max_num_seqs),
    ):
        if x != y:
            out.append(f"{name} {x} -> {y}")
    return ", ".join(out)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _splits(s: T.Setup, pp: int) -> list[tuple[int, ...]]:
    """The two first/last-stage splits with the lightest slowest stage (the LM head weighs on the last)."""
    a = s.arch
    n = a.num_hidden_layers
    if pp == 1:
        return [(n,)]
    base = n // pp
    seen, out = set(), []
    for first in range(max(1, base - 3), base + 3):
        for last in range(max(1, base - 3), base + 3):
            st = M.pipeline_layers(n, pp, first, last)
            if st and min(st) > 0 and tuple(st) not in seen:
                seen.add(tuple(st))
                out.append(tuple(st))
    plain = M.pipeline_layers(n, pp, None, None)
    if plain:
        out.append(tuple(plain))

    def slowest(st: tuple[int, ...]) -> float:
        costs, start = [], 0
        for k, c in enumerate(st):
            lin, core = T._coeffs(a, start, c, k == len(st) - 1)
            costs.append(lin + core)
            start += c
        return max(costs)

    return sorted(set(out), key=slowest)[:2]


def actors(s: T.Setup, npu: bool) -> list[T.Actor]:
    a, g = s.arch, s.group
    world = g.world
    out = []
    for tp in (1, 2, 4, 8, 16):
        if tp > g.ranks_per_node or a.num_attention_heads % tp or world % tp:
            continue
        for pp in _divisors(world // tp):
            if pp > a.num_hidden_layers // 2 and pp > 1:
                continue
            splits = _splits(s, pp)
            eps = _divisors(a.n_routed_experts) if a.moe else [1]
            for st in splits:
                for ep in eps:
                    for etp in sorted({1, tp}):
                        if world % (ep * etp * pp):
                            continue
                        for mb in (1, 2, 4):
                            for rc in (max(st), 0):
                                for off in (True, False):
                                    for opt in (
                                        ("swap", "offload", "device") if npu else ("offload", "device")
                                    ):
                                        out.append(
                                            replace(
                                                s.actor,
                                                tp=tp,
                                                pp=pp,
                                                ep=ep,
                                                etp=etp,
                                                stages=st,
                                                micro_batch=mb,
                                                recompute_layers=rc,
                                                param_offload=off,
                                                grad_offload=off,
                                                ref_param_offload=off,
                                                swap_optimizer=opt == "swap",
                                                optimizer_offload=opt == "offload",
                                            )
                                        )
    return out


def rollouts(s: T.Setup) -> list[T.Rollout]:
    a, g = s.arch, s.group
    out = []
    for tp in (1, 2, 4, 8, 16):
        if tp > g.ranks_per_node or a.num_attention_heads % tp or g.world % tp:
            continue
        engines = g.world // tp
        per_engine = math.ceil(s.sequences / engines)
        for ep in sorted({tp, g.world} if a.moe else {1}):
            if a.moe and a.n_routed_experts % ep and ep != tp:
                continue
            for mns in sorted({s.rollout.max_num_seqs, per_engine}):
                out.append(replace(s.rollout, tp=tp, ep=ep, max_num_seqs=mns))
    return out


def memory_fits(cfg: DictConfig, s: T.Setup) -> tuple[bool, float, M.Estimate | None]:
    """The memory model's verdict for Setup s (the recipe's other memory settings)."""
    g = lambda k, d=None: OmegaConf.select(cfg, "verl." + k, default=d)  # noqa: E731
    act, ro = s.actor, s.rollout
    P, R = int(g("data.max_prompt_length")), int(g("data.max_response_length"))
    mml = int(g("actor_rollout_ref.rollout.max_model_len") or P + R)
    vllm = g("actor_rollout_ref.rollout.name") == "vllm"
    otc = g("actor_rollout_ref.actor.megatron.override_transformer_config") or {}
    bucket = g("actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes")
    if bucket is None:
        bucket = g("actor_rollout_ref.rollout.update_weights_bucket_megabytes")
    lay = M.Layout(world=s.group.world, tp=act.tp, pp=act.pp, ep=act.ep, etp=act.etp, stages=list(act.stages))
    try:
        est = M.estimate(
            s.arch,
            lay,
            capacity_bytes=int(float(cfg.launch.device_memory_gib) * M.GIB),
            seq=P + R,
            micro_batch=act.micro_batch,
            logprob_micro_batch=act.logprob_micro_batch,
            ref_logprob_micro_batch=act.ref_logprob_micro_batch,
            param_offload=act.param_offload,
            grad_offload=act.grad_offload,
            optimizer_on_host=act.swap_optimizer,
            optimizer_offload=act.optimizer_offload,
            ref_param_offload=act.ref_param_offload,
            full_recompute=act.recompute_layers > 0,
            rollout_tp=ro.tp,
            rollout_ep=ro.ep,
            gpu_memory_utilization=float(g("actor_rollout_ref.rollout.gpu_memory_utilization", 0.5))
            if vllm
            else 0.0,
            max_num_seqs=ro.max_num_seqs if vllm else 0,
            max_model_len=mml,
            max_num_batched_tokens=int(g("actor_rollout_ref.rollout.max_num_batched_tokens", P + R) or P + R)
            if vllm
            else 0,
            npu=str(cfg.launch.get("device")) == "npu",
            device=str(cfg.launch.get("device")),
            swap_optimizer_times=int(otc.get("swap_optimizer_times") or 16),
            sync_bucket_bytes=int(bucket or 0) * 2**20 if vllm else 0,
        )
    except (ZeroDivisionError, ValueError):
        return False, math.inf, None
    phases = [ph for ph in est.phases if vllm or not ph.name.startswith(("rollout", "weight sync"))]
    peak = max(ph.ratio for ph in phases)
    return peak <= 1.0 and (not vllm or est.kv_available > 0), peak, est


def kv_seqs(s: T.Setup, est: M.Estimate | None) -> int | None:
    """Sequences of the longest length the KV pool holds (vLLM preempts beyond)."""
    if est is None or est.kv_available <= 0:
        return None
    per_seq = M.kv_bytes_per_token(s.arch, s.rollout.tp) * (s.lengths.prompt + s.lengths.response_max)
    return max(1, int(est.kv_available // per_seq))


def _actor_fits(cfg: DictConfig, base: T.Setup, a: T.Actor) -> bool:
    """The actor's own phases (update, log-probs) fit the device, whatever the rollout."""
    est = memory_fits(cfg, base.with_(actor=a))[2]
    return est is not None and all(ph.ratio <= 1.0 for ph in est.phases if not ph.name.startswith("rollout"))


def _structure(a: T.Actor) -> tuple:
    return (a.tp, a.pp, a.ep, a.etp, a.stages)


def search(cfg: DictConfig, base: T.Setup, f: F.Factors) -> Result:
    npu = str(cfg.launch.get("device")) == "npu"
    acts, ros = actors(base, npu), rollouts(base)
    checked = 0
    # a structure (TP, PP, EP, ETP, split) whose lightest variant (micro-batch 1, full recompute, offload,
    # optimizer on the host) does not fit has no variant that fits: drop it whole
    lightest: dict[tuple, bool] = {}
    for a in acts:
        key = _structure(a)
        if key not in lightest:
            light = replace(
                a,
                micro_batch=1,
                recompute_layers=max(a.stages),
                param_offload=True,
                grad_offload=True,
                ref_param_offload=True,
                swap_optimizer=npu,
                optimizer_offload=not npu,
            )
            checked += 1
            lightest[key] = _actor_fits(cfg, base, light)
    acts = [a for a in acts if lightest[_structure(a)]]
    # time each actor candidate with the recipe's rollout, each rollout with the recipe's actor
    actor_t = sorted(
        ((sum(v for k, v in T.step(base.with_(actor=a), f).seconds().items() if k != "generate"), i, a))
        for i, a in enumerate(acts)
    )
    ro_t = sorted((T.step(base.with_(rollout=r), f).seconds()["generate"], i, r) for i, r in enumerate(ros))
    best: dict[tuple, Candidate] = {}  # the fastest fitting pair of each (actor structure, rollout TP/EP)

    def fifth() -> float:
        times = sorted(c.step_s for c in best.values())
        return times[TOP - 1] if len(times) >= TOP else math.inf

    for at, _, a in actor_t:
        if at + ro_t[0][0] >= fifth():
            break
        checked += 1
        if not _actor_fits(cfg, base, a):
            continue
        for rt, _, r in ro_t:
            if at + rt >= fifth():
                break
            key = (a.tp, a.pp, a.ep, a.etp, r.tp, r.ep)
            if key in best and best[key].step_s <= at + rt:
                continue
            checked += 1
            s = base.with_(actor=a, rollout=r)
            ok, peak, est = memory_fits(cfg, s)
            if not ok:
                continue
            s = s.with_(rollout=replace(r, kv_capacity_seqs=kv_seqs(s, est)))
            st = T.step(s, f)
            c = Candidate(a, s.rollout, st.step_s, st.seconds(), st.dominant(), peak)
            if key not in best or c.step_s < best[key].step_s:
                best[key] = c
    ok, peak, est = memory_fits(cfg, base)
    own_setup = base.with_(rollout=replace(base.rollout, kv_capacity_seqs=kv_seqs(base, est)))
    st = T.step(own_setup, f)
    own = Candidate(base.actor, base.rollout, st.step_s, st.seconds(), st.dominant(), peak)
    top = sorted(best.values(), key=lambda c: c.step_s)[:TOP]
    return Result(own, ok, top, len(acts), len(ros), checked)
