"""Memory rules: the per-rank estimate of each phase (tools/plan/memory.py), its peak against the
device's capacity, and the KV cache against max_num_seqs x max_model_len."""

from __future__ import annotations

from tools.plan import activations as A
from tools.plan import memory as M
from tools.plan.context import Context

G = "memory"
ARR = "actor_rollout_ref."
MG = ARR + "actor.megatron."


def check(ctx: Context) -> None:
    L, g = ctx.launch, ctx.get
    if L.backend != "megatron":
        ctx.skip(G, "device memory", "the estimate covers the Megatron backend")
        return
    bad = ctx.failed("layout") + [
        r for r in ctx.failed("batch") if r.startswith("verl.") or r.startswith("launch.")
    ]
    if bad or ctx.layout is None or ctx.seq is None or ctx.rollout_tp is None:
        ctx.skip(G, "device memory", f"fix the layout and values first ({'; '.join(bad) or 'see above'})")
        return
    gib = ctx.fraction(G, "device_memory_gib", launch=True, high=float("inf"))
    name = g(ARR + "rollout.name")
    vllm = name == "vllm"
    util = ctx.fraction(G, ARR + "rollout.gpu_memory_utilization") if vllm else 0.0
    counts = {
        k: ctx.integer(G, ARR + k, if_null=1)
        for k in (
            "actor.ppo_micro_batch_size_per_gpu",
            "rollout.log_prob_micro_batch_size_per_gpu",
            "ref.log_prob_micro_batch_size_per_gpu",
        )
    }
    mns = ctx.integer(G, ARR + "rollout.max_num_seqs") if vllm else 0
    mbt = ctx.integer(G, ARR + "rollout.max_num_batched_tokens") if vllm else 0
    if gib is None or util is None or mns is None or mbt is None or None in counts.values():
        ctx.skip(G, "device memory", "fix the values above first")
        return
    cap = int(gib * M.GIB)
    swap_times = ctx.integer(G, MG + "override_transformer_config.swap_optimizer_times", if_null=16)
    bucket_key = ARR + "rollout.checkpoint_engine.update_weights_bucket_megabytes"  # verl 0.9.1
    if ctx.get(bucket_key) is None:
        bucket_key = ARR + "rollout.update_weights_bucket_megabytes"  # verl 0.6.0
    bucket_mb = ctx.integer(G, bucket_key, if_null=0, low=0) if vllm else 0
    if swap_times is None or bucket_mb is None:
        ctx.skip(G, "device memory", "fix the values above first")
        return
    otc = g(MG + "override_transformer_config", {}) or {}
    otc = otc if isinstance(otc, dict) else {}
    micro, lp, ref_lp = counts.values()
    try:
        full, selective = A.recompute_setting(otc)
    except ValueError as e:
        ctx.add(G, "activation model", False, str(e), "set a value megatron-core accepts")
        return
    est = M.estimate(
        ctx.arch,
        ctx.layout,
        capacity_bytes=cap,
        seq=ctx.seq,
        micro_batch=micro,
        logprob_micro_batch=lp,
        ref_logprob_micro_batch=ref_lp,
        param_offload=bool(g(MG + "param_offload")),
        grad_offload=bool(g(MG + "grad_offload"))
        or bool(L.get("param_offload_includes_grads") and g(MG + "param_offload")),
        optimizer_on_host=bool(otc.get("swap_optimizer")) and L.device == "npu",
        optimizer_offload=bool(g(MG + "optimizer_offload")),
        ref_param_offload=bool(g(ARR + "ref.megatron.param_offload")),
        full_recompute=full,
        selective=selective,
        rollout_tp=ctx.rollout_tp,
        rollout_ep=ctx.rollout_ep,
        gpu_memory_utilization=util,
        max_num_seqs=mns,
        max_model_len=ctx.max_model_len,
        max_num_batched_tokens=mbt,
        npu=L.device == "npu",
        device=str(L.device),
        swap_optimizer_times=swap_times,
        sync_bucket_bytes=bucket_mb * 2**20,
    )
    if not vllm:  # the HF rollout shares the actor's weights: no separate pool, no weight sync
        est.phases = [ph for ph in est.phases if not ph.name.startswith(("rollout", "weight sync"))]
    ctx.estimate = est
    ctx.add(
        G,
        "activation model",
        True,
        est.activation_model,
        info="by override_transformer_config.recompute_granularity / recompute_modules "
        "(docs/plan-validation.md: how each model was checked)",
    )
    for ph in est.phases:
        ok = ph.ratio <= 0.9
        peak = f"; peak {ph.peak / M.GIB:.1f} GiB at {ph.peak_moment}" if ph.peak > ph.total else ""
        ctx.add(
            G,
            ph.name,
            ok if ph.ratio <= 1.0 else False,
            f"{ph.peak / M.GIB:.1f} of {cap / M.GIB:.0f} GiB ({ph.ratio:.0%}); resident {ph.total / M.GIB:.1f}{peak}",
            "the peak is over 90% of the device: little headroom for fragmentation"
            if ph.ratio <= 1.0
            else f"the peak ({ph.peak_moment}) is over capacity: turn on param/grad offload, the swap optimizer or optimizer_offload, "
            "raise PP/EP, or lower the micro-batch",
            warn=ph.ratio <= 1.0,
            info=", ".join(f"{p.name} {p.bytes / M.GIB:.1f}" for p in ph.parts if p.bytes),
        )
    if vllm:
        ok = est.kv_available >= est.kv_needed
        ctx.add(
            G,
            "KV cache holds max_num_seqs x max_model_len",
            ok if est.kv_available > 0 else False,
            f"needs {est.kv_needed / M.GIB:.1f} GiB, pool leaves {est.kv_available / M.GIB:.1f} GiB",
            "vLLM will preempt and recompute sequences: raise gpu_memory_utilization (if the rest "
            "fits), offload more, or lower max_num_seqs"
            if est.kv_available > 0
            else "no room for any KV cache: the rollout weights alone exceed the pool",
            warn=est.kv_available > 0,
        )
