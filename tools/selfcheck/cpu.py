"""The CPU forms: tiny modules, gloo, vLLM's own code from the patched tree. They exercise the same
verl/vLLM code paths as on an NPU; only the device and the executor are stand-ins."""

from __future__ import annotations

import os
import traceback
import types

import torch

from tools.selfcheck import tiny
from tools.selfcheck.ranks import run_ranks
from tools.selfcheck.result import CheckFailed


def _offloader(model, runner, forward_context, engine):
    from verl.workers.rollout.npu.offload import ManualOffloader

    return ManualOffloader(model, runner, forward_context, engine, torch.float32, empty_cache=lambda: None)


def offload_cycle() -> str:
    """Logits equal across release -> resume(weights) -> load -> rebuild -> resume(kv_cache)."""
    torch.manual_seed(0)
    model, runner, fc, engine, _ = tiny.tiny_engine()
    off = _offloader(model, runner, fc, engine)
    ids = torch.arange(12) % tiny.VOCAB
    with torch.no_grad():
        before = model(ids)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}  # what the trainer sends
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_before = sum(c.numel() * c.element_size() for c in runner.kv_caches)
    off.release()
    resident = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_resident = sum(c.numel() * c.element_size() for c in runner.kv_caches)
    if resident or kv_resident:
        raise CheckFailed(f"after release {resident} B of weights and {kv_resident} B of KV cache remain")
    off.resume(["weights"])
    model.load_weights(weights.items())
    off.rebuild_mla()
    off.resume(["kv_cache"])
    with torch.no_grad():
        after = model(ids)
    diff = (after - before).abs().max().item()
    if diff != 0.0:
        raise CheckFailed(f"logits differ after one cycle: max |d| = {diff:.3g}")
    kv_after = sum(c.numel() * c.element_size() for c in runner.kv_caches)
    if kv_after != kv_before:
        raise CheckFailed(f"KV cache {kv_after} B after the cycle, {kv_before} B before")
    return f"max |dlogit| 0; released {total} B weights + {kv_before} B KV, all back"


def mla_rebuild() -> str:
    """After a weight update, W_UV/W_UK_T equal the ones computed from the new kv_b_proj."""
    torch.manual_seed(1)
    model, runner, fc, engine, _ = tiny.tiny_engine()
    off = _offloader(model, runner, fc, engine)
    off.release()
    off.resume(["weights"])
    new = {n: torch.randn(p.shape) for n, p in model.named_parameters()}
    model.load_weights(new.items())
    n = off.rebuild_mla()
    worst = 0.0
    for i, layer in enumerate(fc.values()):
        w_uv, w_uk_t = tiny.derived(new[f"layers.{i}.kv_b_proj.weight"])
        worst = max(
            worst,
            (layer.impl.W_UV - w_uv).abs().max().item(),
            (layer.impl.W_UK_T - w_uk_t).abs().max().item(),
        )
    if n != tiny.LAYERS or worst != 0.0:
        raise CheckFailed(f"{n} layers rebuilt, max |d| {worst:.3g}")
    return f"{n} MLA layers rebuilt, max |d| 0"


def _rank(rank: int, world: int, tp: int, port: int, queue) -> None:
    out: dict = {}
    try:
        import torch.distributed as dist
        from verl.workers.rollout.npu import dp_groups as dpg

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_DP_")}  # this check's own layout
        env.update(VLLM_DP_SIZE=str(world // tp), VLLM_VERSION="0.9.1", GLOO_SOCKET_IFNAME="lo")
        dp = dpg.validate(env, world, tp)
        dpg.apply_env(dpg.plan_env(rank, world, tp, dp, dpg.gather_addresses(dpg.node_address(env)), port))
        lay = dpg.rank_layout(rank, world, tp, dp)
        wrong = []
        for kind, groups in dpg.all_groups(world, tp, dp).items():
            for ranks in groups:
                g = dist.new_group(list(ranks))
                if rank in ranks:
                    t = torch.tensor([rank + 1.0])
                    dist.all_reduce(t, group=g)
                    if t.item() != sum(r + 1 for r in ranks):
                        wrong.append(kind)
        dpg.init_vllm_groups(tp, backend="gloo", device="cpu")
        from vllm.distributed import parallel_state as ps

        ours = {"tp": list(lay.tp_group), "dp": list(lay.dp_group), "ep": list(lay.ep_group)}
        theirs = {"tp": ps.get_tp_group().ranks, "dp": ps.get_dp_group().ranks, "ep": ps.get_ep_group().ranks}
        if ours != {k: list(v) for k, v in theirs.items()}:
            wrong.append(f"vLLM groups {theirs} != ours {ours}")
        out["wrong"] = wrong
        dist.barrier()
    except Exception:
        out["error"] = traceback.format_exc(limit=-3)
    queue.put((rank, out))


def groups(world: int = 4, tp: int = 2) -> str:
    """gloo: groups built from the computed VLLM_DP_* environment, all-reduce in each, vLLM's equal."""
    import vllm.distributed  # noqa: F401  (import once here; the ranks are forked)

    run_ranks(_rank, world, tp, start_method="fork", timeout=300, what="ranks with wrong groups")
    dp = world // tp
    return (
        f"gloo world {world}, TP {tp}, DP {dp}: {world // tp} TP + {tp} DP + 1 EP groups sum right, = vLLM's"
    )


def compile_real() -> str:
    """Inside real_torch_compile the real torch.compile runs (MindSpeed's pass-through emulated on CPU)."""
    import sys

    from verl.workers.rollout.npu.real_compile import is_real_compile, real_torch_compile

    real = torch.compile

    def pass_through(*args, **kwargs):  # the shape of MindSpeed's replacement
        if args and callable(args[0]):
            return lambda *a, **k: args[0](*a, **k)
        return lambda fn: (lambda *a, **k: fn(*a, **k))

    fake = types.ModuleType("mindspeed.patch_utils")
    fake.MindSpeedPatchesManager = types.SimpleNamespace(
        patches_info={"torch.compile": types.SimpleNamespace(orig_func=real)}
    )
    saved = sys.modules.get("mindspeed.patch_utils")
    sys.modules["mindspeed.patch_utils"] = fake
    torch.compile = pass_through
    graphs = []
    try:
        with real_torch_compile():
            if not is_real_compile():
                raise CheckFailed("torch.compile is still the pass-through inside the block")
            fn = torch.compile(
                lambda x: torch.sin(x) + 1, backend=lambda gm, ex: graphs.append(gm) or gm.forward
            )
            fn(torch.randn(3))
        restored = torch.compile is pass_through
    finally:
        torch.compile = real
        if saved is None:
            sys.modules.pop("mindspeed.patch_utils", None)
        else:
            sys.modules["mindspeed.patch_utils"] = saved
    if len(graphs) != 1 or not restored:
        raise CheckFailed(f"{len(graphs)} graphs compiled; pass-through restored: {restored}")
    return "1 graph compiled inside; pass-through back after (MindSpeed emulated)"


def kv_recreate(times: int = 5) -> str:
    """The KV cache re-created N times keeps the start-up block count; memory is never profiled again."""
    model, runner, fc, engine, executor = tiny.tiny_engine()
    off = _offloader(model, runner, fc, engine)
    start_blocks = [c.shape[0] for c in runner.kv_caches]
    for _ in range(times):
        off.free_kv_cache()
        off.recreate_kv_cache()
        blocks = [c.shape[0] for c in runner.kv_caches]
        if blocks != start_blocks:
            raise CheckFailed(f"blocks {blocks} after re-creation, {start_blocks} at start-up")
    profiled = executor.calls.count("determine_available_memory")
    if profiled != 1 or any(h is not engine.kv_cache_configs for h in executor.handed[1:]):
        raise CheckFailed(f"memory profiled {profiled} times; configs re-derived")
    return f"{times} re-creations, {start_blocks[0]} blocks per layer each time, profiled once"
