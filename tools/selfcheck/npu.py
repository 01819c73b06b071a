"""The NPU forms: a real vLLM engine (vllm-ascend) on one NPU, hccl across the node's NPUs.

Written against torch_npu, hccl, vllm-ascend v0.9.1rc3 and MindSpeed, but NOT run: this project had no
NPU when they were written. They need `--model DIR`, a small DeepSeek-V3-architecture HF model
(config + tokenizer; weights are random, load_format=dummy) for the engine-backed checks.
"""

from __future__ import annotations

import os
import traceback

import torch

from tools.selfcheck.ranks import free_port, run_ranks
from tools.selfcheck.result import CheckFailed

MEMORY_SLACK = 4 << 20  # bytes: allocator rounding between two identical allocations

_ENGINE: dict = {}


def _init_world_one() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    port = free_port()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    torch.npu.set_device(0)
    dist.init_process_group("hccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def engine(model_dir: str):
    """One vLLM engine as verl builds it on NPU (sleep mode off, vllm-ascend arguments), and its
    ManualOffloader; built inside real_torch_compile as verl's megatron worker does."""
    if "llm" in _ENGINE:
        return _ENGINE["llm"], _ENGINE["off"]
    os.environ.setdefault("VLLM_VERSION", "0.9.1")
    os.environ.setdefault("VLLM_USE_V1", "1")
    _init_world_one()
    from verl.workers.rollout.npu import offload
    from verl.workers.rollout.npu.engine_args import ascend_engine_args
    from verl.workers.rollout.npu.real_compile import real_torch_compile

    graph = os.environ.get("VLLM_ENABLE_GRAPH_MODE", "0") == "1"
    args = ascend_engine_args(
        max_num_batched_tokens=512, max_model_len=512, max_num_seqs=8, enforce_eager=not graph, env=os.environ
    )
    with real_torch_compile():
        from vllm import LLM

        llm = LLM(
            model=model_dir, tensor_parallel_size=1, distributed_executor_backend="external_launcher",
            enforce_eager=not graph, enable_sleep_mode=False, max_model_len=512,
            max_num_batched_tokens=args.max_num_batched_tokens, enable_chunked_prefill=False,
            enable_prefix_caching=False, additional_config=args.additional_config,
            gpu_memory_utilization=0.5, load_format="dummy", seed=0, trust_remote_code=True,
        )  # fmt: skip
    off = offload.from_llm(llm, torch.npu.empty_cache)
    _ENGINE.update(llm=llm, off=off)
    return llm, off


def _greedy_logprobs(llm) -> list[dict[int, float]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=4, temperature=0.0, logprobs=20, seed=0)
    out = llm.generate([{"prompt_token_ids": list(range(10, 42))}], params, use_tqdm=False)
    return [{t: lp.logprob for t, lp in step.items()} for step in out[0].outputs[0].logprobs]


def offload_cycle(model_dir: str) -> str:
    llm, off = engine(model_dir)
    model = off.model
    before = _greedy_logprobs(llm)
    weights = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()}
    torch.npu.synchronize()
    baseline = torch.npu.memory_allocated()
    llm.reset_prefix_cache()
    off.release()
    released = baseline - torch.npu.memory_allocated()
    off.resume(["weights"])
    for name, p in model.named_parameters():  # what update_weights does, without name mapping
        p.data.copy_(weights[name].to(p.device))
    off.rebuild_mla()
    off.resume(["kv_cache"])
    torch.npu.synchronize()
    back = torch.npu.memory_allocated()
    after = _greedy_logprobs(llm)
    worst = 0.0
    for a, b in zip(before, after, strict=True):
        if set(a) != set(b):
            raise CheckFailed("top-20 tokens differ after one offload/onload cycle (frozen parameters?)")
        worst = max(worst, *(abs(a[t] - b[t]) for t in a))
    if worst > 1e-6:
        raise CheckFailed(
            f"logprobs differ after one cycle: max |d| {worst:.3g} (torchair frozen parameters?)"
        )
    if abs(back - baseline) > MEMORY_SLACK:
        raise CheckFailed(f"device memory {back} B after the cycle, baseline {baseline} B")
    return f"max |dlogprob| {worst:.1g}; released {released / 2**30:.2f} GiB, back to baseline +-{abs(back - baseline)} B"


def mla_rebuild(model_dir: str) -> str:
    llm, off = engine(model_dir)
    from verl.workers.rollout.npu.offload import mla_layers

    layers = list(mla_layers(off.model))
    if not layers:
        raise CheckFailed("the model has no MLA layers: use a DeepSeek-V3-architecture model")
    worst = 0.0
    for layer in layers:
        impl = layer.impl
        w = impl.kv_b_proj.weight
        w.data.copy_(torch.randn_like(w) * 0.02)  # a weight update
    off.rebuild_mla()
    for layer in layers:
        impl = layer.impl
        kv = impl.kv_b_proj.weight.T.reshape(
            impl.kv_lora_rank, impl.num_heads, impl.qk_nope_head_dim + impl.v_head_dim
        )
        w_uk, w_uv = kv.split([impl.qk_nope_head_dim, impl.v_head_dim], dim=-1)
        worst = max(
            worst,
            (impl.W_UV.float() - w_uv.transpose(0, 1).float()).abs().max().item(),
            (impl.W_UK_T.float() - w_uk.permute(1, 2, 0).float()).abs().max().item(),
        )
    if worst != 0.0:
        raise CheckFailed(f"MLA-derived tensors differ from the new weights: max |d| {worst:.3g}")
    return f"{len(layers)} MLA layers rebuilt from new weights, max |d| 0"


def _rank(rank: int, world: int, tp: int, port: int, queue) -> None:
    out: dict = {}
    try:
        import torch.distributed as dist
        import torch_npu  # noqa: F401
        from verl.workers.rollout.npu import dp_groups as dpg

        torch.npu.set_device(rank)
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank), RANK=str(rank)
        )
        dist.init_process_group("hccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_DP_")}  # this check's own layout
        env.update(VLLM_DP_SIZE=str(world // tp), VLLM_VERSION="0.9.1")
        env.setdefault("HCCL_SOCKET_IFNAME", "lo")
        dp = dpg.validate(env, world, tp)
        dpg.apply_env(dpg.plan_env(rank, world, tp, dp, dpg.gather_addresses(dpg.node_address(env)), port))
        dpg.init_vllm_groups(tp, backend="hccl", device="npu")
        from vllm.distributed import parallel_state as ps

        wrong = []
        for kind, g in {"tp": ps.get_tp_group(), "dp": ps.get_dp_group(), "ep": ps.get_ep_group()}.items():
            t = torch.tensor([rank + 1.0], device="npu")
            dist.all_reduce(t, group=g.device_group)
            if t.item() != sum(r + 1 for r in g.ranks):
                wrong.append(kind)
        lay = dpg.rank_layout(rank, world, tp, dp)
        if list(ps.get_ep_group().ranks) != list(lay.ep_group):
            wrong.append("ep group is not every rank of the block")
        out["wrong"] = wrong
        dist.barrier()
    except Exception:
        out["error"] = traceback.format_exc(limit=-3)
    queue.put((rank, out))


def groups(world: int | None = None, tp: int = 2) -> str:
    world = world or torch.npu.device_count()
    run_ranks(_rank, world, tp, start_method="spawn", timeout=600, what="hccl groups wrong on ranks")
    return f"hccl world {world}, TP {tp}, DP {world // tp}: TP/DP/EP all-reduce right"


def compile_real(model_dir: str) -> str:
    """With MindSpeed loaded, the rollout's model is really compiled by torchair."""
    import mindspeed.megatron_adaptor  # noqa: F401  (installs MindSpeed's pass-through)
    from verl.workers.rollout.npu.real_compile import is_real_compile

    if is_real_compile():
        note = "MindSpeed left torch.compile alone"
    else:
        note = "MindSpeed's pass-through active outside"
    if os.environ.get("VLLM_ENABLE_GRAPH_MODE", "0") != "1":
        raise CheckFailed("set VLLM_ENABLE_GRAPH_MODE=1: without torchair graph mode nothing is compiled")
    llm, off = engine(model_dir)
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    compiled = getattr(runner, "torchair_compiled_model", None)
    if not isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule):
        raise CheckFailed(
            f"the rollout's model is not compiled: torchair_compiled_model is {type(compiled).__name__}"
        )
    return f"torchair_compiled_model is a dynamo OptimizedModule ({note})"


def kv_recreate(model_dir: str, times: int = 5) -> str:
    llm, off = engine(model_dir)
    core = off.engine_core
    blocks = [cfg.num_blocks for cfg in core.kv_cache_configs]
    shapes = [
        tuple(c.shape) if torch.is_tensor(c) else tuple(t.shape for t in c)
        for c in off.model_runner.kv_caches
    ]
    for _ in range(times):
        off.free_kv_cache()
        off.recreate_kv_cache()
        now = [
            tuple(c.shape) if torch.is_tensor(c) else tuple(t.shape for t in c)
            for c in off.model_runner.kv_caches
        ]
        if now != shapes or [cfg.num_blocks for cfg in core.kv_cache_configs] != blocks:
            raise CheckFailed(f"KV cache changed on re-creation: {now[:1]} vs {shapes[:1]}")
    _greedy_logprobs(llm)  # the engine still generates on the re-created cache
    return f"{times} re-creations, {blocks[0]} blocks each time, generation OK"
