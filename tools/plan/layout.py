"""Layout rules: world = nodes x devices; actor TP*PP*CP | world; EP | experts; ETP*EP*PP | world; the
pipeline layer list sums to the layer count; rollout TP | world and TP x VLLM_DP_SIZE = world (or, in
server mode, replicas of TP x DP x PP); the reference uses the actor's layout."""

from __future__ import annotations

from tools.patches.config import load_upstreams
from tools.plan import memory as M
from tools.plan.context import Context
from tools.recipes import recipe as R

G = "layout"
MG = "actor_rollout_ref.actor.megatron."
RO = "actor_rollout_ref.rollout."


def check(ctx: Context) -> None:
    L, a = ctx.launch, ctx.arch
    nodes = ctx.integer(G, "nodes", launch=True)
    per_node = ctx.integer(G, "devices_per_node", launch=True)
    if nodes is None or per_node is None:
        ctx.skip(G, "layout rules", "fix launch.nodes / launch.devices_per_node first")
        return
    world = nodes * per_node
    ctx.world = world
    nn, ng = ctx.get("trainer.nnodes"), ctx.get("trainer.n_gpus_per_node")
    ctx.add(
        G,
        "world = nodes x devices",
        (nn, ng) == (nodes, per_node),
        f"{nodes} x {per_node} = {world}; verl trainer {nn} x {ng}",
        "set verl.trainer.nnodes/n_gpus_per_node to ${launch.nodes}/${launch.devices_per_node}",
    )
    ctx.layout = M.Layout(world=world, stages=[a.num_hidden_layers])
    if L.backend == "megatron":
        actor_rules(ctx, world)
    rollout_rules(ctx, world)


def actor_rules(ctx: Context, world: int) -> None:
    a = ctx.arch
    sizes = {
        k: ctx.integer(G, MG + k, default=1)
        for k in (
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "context_parallel_size",
            "expert_model_parallel_size",
        )
    }
    etp = ctx.integer(G, MG + "expert_tensor_parallel_size", default=1, if_null=1)
    if None in sizes.values() or etp is None:
        ctx.layout = None
        return
    tp, pp, cp, ep = sizes.values()
    ok = world % (tp * pp * cp) == 0
    ctx.add(
        G,
        "actor TP x PP x CP divides world",
        ok,
        f"TP{tp} x PP{pp} x CP{cp} = {tp * pp * cp}, world {world}"
        + (f", DP {world // (tp * pp * cp)}" if ok else ""),
        "choose tensor/pipeline/context parallel sizes whose product divides nodes x devices",
    )
    if a.moe:
        ctx.add(
            G,
            "actor EP divides the experts",
            a.n_routed_experts % ep == 0,
            f"{a.n_routed_experts} experts / EP{ep}"
            + (f" = {a.n_routed_experts // ep} a rank" if a.n_routed_experts % ep == 0 else ""),
            f"expert_model_parallel_size must divide {a.n_routed_experts}",
        )
        ctx.add(
            G,
            "ETP x EP x PP divides world",
            world % (etp * ep * pp) == 0,
            f"ETP{etp} x EP{ep} x PP{pp} = {etp * ep * pp}, world {world}"
            + (f", expert-DP {world // (etp * ep * pp)}" if world % (etp * ep * pp) == 0 else ""),
            "megatron-core needs world % (ETP*EP*PP) == 0: lower EP or ETP",
        )
    elif ep > 1:
        ctx.add(G, "EP on a dense model", False, f"EP{ep}", "set expert_model_parallel_size=1", warn=True)
    otc = ctx.get(MG + "override_transformer_config", {}) or {}
    otc = otc if isinstance(otc, dict) else {}
    stages = pipeline_rules(ctx, a.num_hidden_layers, pp, otc)
    if stages:
        ctx.layout = M.Layout(world=world, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, stages=stages)
        recompute_rule(ctx, otc, stages)
    reference_rule(ctx)


def recompute_rule(ctx: Context, otc: dict, stages: list[int]) -> None:
    gran, meth, n = (
        otc.get("recompute_granularity"),
        otc.get("recompute_method"),
        otc.get("recompute_num_layers"),
    )
    if gran == "full" and meth == "block":
        whole = isinstance(n, int) and not isinstance(n, bool)
        ctx.add(
            G,
            "recompute block fits a stage",
            whole and 0 < n <= max(stages),
            f"recompute_num_layers {n!r}, stage layers {sorted(set(stages))}",
            f"block recompute counts layers per stage: set override_transformer_config.recompute_num_layers "
            f"to a whole number in 1..{max(stages)} (the largest stage)",
            warn=whole,
            info="stages with fewer layers recompute all of them",
        )


def reference_rule(ctx: Context) -> None:
    ref = "actor_rollout_ref.ref.megatron."
    keys = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size")
    same = all(ctx.get(ref + k, 1) == ctx.get(MG + k, 1) for k in keys)
    ctx.add(
        G,
        "reference uses the actor's layout",
        same,
        f"ref TP{ctx.get(ref + keys[0])} PP{ctx.get(ref + keys[1])} EP{ctx.get(ref + keys[2])}",
        "the colocated reference shares the actor's process groups: set ref.megatron sizes "
        "equal to actor.megatron's",
        warn=True,
    )


def megatron_version(ctx: Context) -> str:
    """The megatron-core release the recipe's stack pins (patches/<stack>/upstreams.toml)."""

    pin = load_upstreams(R.REPO, ctx.launch.stack)["megatron"].pypi
    return pin.version if pin else "(unpinned)"


def pipeline_rules(ctx: Context, num_layers: int, pp: int, otc: dict) -> list[int] | None:
    """The layers of each pipeline stage, from Megatron's first/last-stage keys or MindSpeed's per-stage
    list (pipeline_num_transformer_layers), checked against each other; None when wrong."""
    first_key, last_key, list_key = (
        "num_layers_in_first_pipeline_stage",
        "num_layers_in_last_pipeline_stage",
        "pipeline_num_transformer_layers",
    )
    first = ctx.integer(G, MG + "override_transformer_config." + first_key, if_null=0)
    last = ctx.integer(G, MG + "override_transformer_config." + last_key, if_null=0)
    if first is None or last is None:
        return None  # a FAIL names the key
    first, last = first or None, last or None  # 0: not set
    megatron = M.pipeline_layers(num_layers, pp, first, last)
    given = otc.get(list_key)
    if given is None:
        ctx.add(
            G,
            "pipeline layers sum to the layer count",
            megatron is not None and sum(megatron) == num_layers and min(megatron) > 0,
            f"{megatron} = {sum(megatron) if megatron else '?'} of {num_layers} layers "
            f"(PP{pp}, first {first}, last {last})",
            f"with PP{pp}: {num_layers} - first - last must split evenly over the "
            f"{max(pp - (first is not None) - (last is not None), 0)} middle stages "
            f"(override_transformer_config.{first_key}/{last_key}, or {list_key}=[...] with one entry "
            "a stage)",
        )
        return megatron
    try:
        listed = M.stage_list(given)
    except ValueError as e:
        ctx.add(
            G, "pipeline layers sum to the layer count", False, f"{list_key}={given!r}",
            f"{e}: give one entry a stage, e.g. [6,8,8,8,8,8,8,7] (or [[6],[8],...] with virtual stages)",
        )  # fmt: skip
        return None
    ok = len(listed) == pp and sum(listed) == num_layers and min(listed, default=0) > 0
    ctx.add(
        G,
        "pipeline layers sum to the layer count",
        ok,
        f"{listed} = {sum(listed)} of {num_layers} layers (PP{pp}, {list_key}: {len(listed)} entries)",
        f"override_transformer_config.{list_key} needs PP={pp} entries, each > 0, summing to "
        f"{num_layers}; it has {len(listed)} summing to {sum(listed)}",
    )
    if not ok:
        return None
    # megatron-core (0.12.1 and 0.16.1 alike) builds each stage from the first/last-stage keys
    # (transformer_block.get_num_layers_to_build), which verl passes to Megatron on every device;
    # MindSpeed (NPU) reads the list as well. Both must describe the same stages.
    mcore = f"megatron-core {megatron_version(ctx)}"
    expressible = pp == 1 or len(set(listed[1:-1])) <= 1
    want_first = listed[0] if pp > 1 and listed[0] != listed[min(1, pp - 1)] else None
    want_last = listed[-1] if pp > 1 and listed[-1] != listed[max(pp - 2, 0)] else None
    if pp > 2 and not expressible:
        fix = (
            f"{mcore} places only an uneven first and last stage (even middle stages): "
            f"{listed} cannot be built; make the middle stages equal"
        )
        agree = False
    elif megatron == listed:
        agree, fix = True, ""
    else:
        agree = False
        keys = " ".join(
            f"{k}={v}" for k, v in ((first_key, want_first), (last_key, want_last)) if v is not None
        )
        fix = (
            f"{mcore} builds the stages from {first_key}/{last_key} (now first {first}, "
            f"last {last}: {megatron or f'{num_layers} layers do not split over PP{pp}'}), not from "
            f"{list_key}: set {keys or 'both to null'} in override_transformer_config, as the published "
            "run does"
        )
    ctx.add(
        G,
        "Megatron's first/last-stage keys match the layer list",
        agree,
        f"{list_key} {listed}; {first_key} {first}, {last_key} {last}",
        fix,
    )
    return listed if agree else None


def rollout_rules(ctx: Context, world: int) -> None:
    a = ctx.arch
    rname = ctx.get(RO + "name")
    rtp = ctx.integer(G, RO + "tensor_model_parallel_size", default=1)
    if rtp is None:
        return
    ctx.rollout_tp = rtp
    ctx.add(
        G,
        "rollout TP divides world",
        world % rtp == 0,
        f"TP{rtp}, world {world}",
        "rollout.tensor_model_parallel_size must divide nodes x devices",
    )
    ctx.add(
        G,
        "rollout TP divides attention heads",
        a.num_attention_heads % rtp == 0,
        f"{a.num_attention_heads} heads / TP{rtp}",
        "pick a rollout TP that divides the head count",
    )
    ctx.rollout_ep = 1
    if rname == "vllm" and ctx.launch.get("rollout_mode") == "server":
        server_rollout_rules(ctx, world, rtp)
    elif rname == "vllm":
        env = R.verl_env(ctx.cfg)
        dp = env.get("VLLM_DP_SIZE")
        ok = dp is not None and dp.isdigit() and int(dp) > 0 and int(dp) * rtp == world
        ctx.add(
            G,
            "rollout TP x VLLM_DP_SIZE = world",
            ok,
            f"TP{rtp} x VLLM_DP_SIZE {dp} = {int(dp) * rtp if dp and dp.isdigit() else '?'}, world {world}",
            f"set launch.env.VLLM_DP_SIZE={world // rtp if world % rtp == 0 else '?'} "
            "(= world / rollout TP); otherwise expert parallelism silently shrinks to the TP group",
        )
        if ok:
            ctx.rollout_ep = int(dp) * rtp if a.moe else 1
            rollout_experts_rule(ctx)


def server_rollout_rules(ctx: Context, world: int, rtp: int) -> None:
    """verl's server-mode rollout (current stack): replicas of TP x DP x PP ranks, vLLM's own DP and EP."""
    dp = ctx.integer(G, RO + "data_parallel_size", default=1)
    pp = ctx.integer(G, RO + "pipeline_model_parallel_size", default=1)
    ep = ctx.integer(G, RO + "expert_parallel_size", default=1)
    if None in (dp, pp, ep):
        return
    replica = rtp * dp * pp
    ctx.add(
        G,
        "rollout replica TP x DP x PP divides world",
        world % replica == 0,
        f"TP{rtp} x DP{dp} x PP{pp} = {replica}, world {world}"
        + (f", {world // replica} replica(s)" if world % replica == 0 else ""),
        "choose rollout tensor/data/pipeline parallel sizes whose product divides nodes x devices",
    )
    ctx.add(
        G,
        "rollout EP = TP x DP (or 1)",
        ep in (1, rtp * dp),
        f"EP{ep}, TP{rtp} x DP{dp} = {rtp * dp}",
        f"set rollout.expert_parallel_size={rtp * dp} (experts over the replica's ranks) or 1 (TP-sharded experts)",
    )
    env = R.verl_env(ctx.cfg)
    ctx.add(
        G,
        "no VLLM_DP_SIZE with server-mode rollout",
        "VLLM_DP_SIZE" not in env,
        f"VLLM_DP_SIZE={env.get('VLLM_DP_SIZE')}" if "VLLM_DP_SIZE" in env else "unset",
        "verl passes rollout.data_parallel_size to vLLM itself: drop launch.env.VLLM_DP_SIZE "
        "and set verl.actor_rollout_ref.rollout.data_parallel_size",
        warn=True,
    )
    if ep > 1 and ctx.arch.moe:
        ctx.rollout_ep = ep
        rollout_experts_rule(ctx)


def rollout_experts_rule(ctx: Context) -> None:
    a = ctx.arch
    if a.moe:
        ctx.add(
            G,
            "rollout EP divides the experts",
            a.n_routed_experts % ctx.rollout_ep == 0,
            f"{a.n_routed_experts} experts / EP{ctx.rollout_ep}",
            "vLLM spreads the remainder unevenly: prefer an EP group that divides the experts",
            warn=True,
        )
