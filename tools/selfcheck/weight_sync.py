"""selfcheck `weight-sync`: separate_async's weight sync through a real checkpoint engine, verl's protocol.

verl 0.9.1's separate_async trainer sends the actor's weights to standalone rollout replicas after every
step through a checkpoint engine (docs/async.md). This check runs that engine's own protocol (prepare ->
build_topology -> init_process_group -> send_weights / receive_weights -> finalize) with one sender and
several receivers, twice with different weights, and requires every receiver to hold the sender's tensors
bit for bit (names, dtypes, shapes, bytes), a tensor larger than a bucket and mixed dtypes included.

- CPU form: tools/verl_plugins/gloo_engine.py (the engine `make train ARGS='mode=separate_async'` uses on CPU),
  ranks in threads over real gloo groups.
- NPU form: verl's HCCL engine (verl/checkpoint_engine/hccl_checkpoint_engine.py, registered as "nccl" on
  Ascend), one process per NPU of the node (`torch.npu.set_device` first: verl #6569), HCCL_CONNECT_TIMEOUT
  and HCCL_EXEC_TIMEOUT set. Written against torch-npu 2.10 / verl 0.9.1 and NOT run here (no NPU): expect
  small API mismatches the first time.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

BUCKET = 1 << 20


def weights(seed: int, scale: int = 1) -> dict[str, torch.Tensor]:
    """A model-like set: bf16 matrices, an fp32 bias after an odd-length bf16 vector, one tensor > a bucket."""
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(1000 * scale, 64, generator=g).to(torch.bfloat16),
        "model.layers.0.input_layernorm.weight": torch.randn(63, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.gate.e_score_correction_bias": torch.randn(64, generator=g),
        "model.layers.0.mlp.experts.0.down_proj.weight": torch.randn(
            768, 512, generator=g
        ),  # 1.5 MiB > the bucket
        "lm_head.weight": torch.randn(1000 * scale, 64, generator=g).to(torch.bfloat16),
    }


def compare(sent: dict[str, torch.Tensor], got: dict[str, torch.Tensor], who: str) -> None:
    """Raise naming the first tensor a receiver does not hold bit for bit."""
    if list(got) != list(sent):
        missing = [n for n in sent if n not in got]
        raise AssertionError(
            f"{who}: tensors {missing[:3]} missing or out of order ({len(got)} of {len(sent)})"
        )
    for name, t in sent.items():
        r = got[name].detach().to("cpu")
        if r.dtype != t.dtype or r.shape != t.shape:
            raise AssertionError(
                f"{who}: {name} is {r.dtype} {tuple(r.shape)}, sent {t.dtype} {tuple(t.shape)}"
            )
        if not torch.equal(r.contiguous().view(torch.uint8), t.contiguous().view(torch.uint8)):
            raise AssertionError(f"{who}: {name} differs from the sender's")


def _send(engine: Any, w: dict[str, torch.Tensor], device: str) -> None:
    asyncio.run(engine.send_weights(((n, t.to(device)) for n, t in w.items())))


def _receive(engine: Any) -> dict[str, torch.Tensor]:
    async def go():
        out = {}
        async for name, t in engine.receive_weights():
            out[name] = t.detach().to("cpu").clone()
        return out

    return asyncio.run(go())


def in_threads(make: Callable[[bool], Any], w: dict[str, torch.Tensor], receivers: int) -> list[dict]:
    """One sync with every rank a thread of this process (the CPU form)."""
    engines = [make(True)] + [make(False) for _ in range(receivers)]
    meta = [e.prepare() for e in engines]
    actor_kw, rollout_kw = type(engines[0]).build_topology(1, receivers, meta)
    got: list[dict] = [{} for _ in range(receivers)]
    errors: list[BaseException] = []

    def rank(i: int) -> None:
        try:
            e = engines[i]
            kw = actor_kw if i == 0 else rollout_kw
            e.init_process_group(**{k: v[0 if i == 0 else i - 1] for k, v in kw.items()})
            if i == 0:
                _send(e, w, "cpu")
            else:
                got[i - 1] = _receive(e)
            e.finalize()
        except BaseException as ex:  # noqa: BLE001 - re-raised below
            errors.append(ex)

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(receivers + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    if any(t.is_alive() for t in threads):
        raise AssertionError("the sync hung (a rank still waits after 300 s)")
    if errors:
        raise errors[0]
    return got


def check(sync: Callable[[dict[str, torch.Tensor]], list[dict]], engine: str, rounds: int = 2) -> str:
    """`rounds` syncs with different weights through `sync`; every receiver bit-identical each time."""
    start = time.perf_counter()
    receivers = 0
    for r in range(rounds):
        w = weights(r)
        got = sync(w)
        receivers = len(got)
        for j, g in enumerate(got):
            compare(w, g, f"sync {r + 1}, receiver {j + 1}")
    w = weights(0)
    size = sum(t.nbytes for t in w.values())
    return (
        f"{engine}: {rounds} syncs of {len(w)} tensors ({size / 2**20:.1f} MiB, bf16 + fp32, one > the "
        f"{BUCKET >> 20} MiB bucket) to {receivers} receivers, bit-identical ({time.perf_counter() - start:.1f} s)"
    )


def cpu_form(receivers: int = 2) -> str:
    from tools.verl_plugins.gloo_engine import GlooCheckpointEngine  # torch, verl: only the CPU form runs it

    return check(
        lambda w: in_threads(
            lambda master: GlooCheckpointEngine(bucket_size=BUCKET, is_master=master), w, receivers
        ),
        "gloo engine (tools/verl_plugins/gloo_engine.py)",
    )


# ---- NPU form (not run here) ------------------------------------------------------------------------


def _npu_rank(rank: int, world: int, w: dict, queue: Any, results: Any) -> None:
    import torch_npu  # noqa: F401 - registers the npu device

    torch.npu.set_device(rank)  # before any HCCL call in this process (verl #6569)
    from verl.checkpoint_engine import CheckpointEngineRegistry

    engine = CheckpointEngineRegistry.new("nccl", bucket_size=BUCKET, is_master=rank == 0)
    meta = engine.prepare()
    if rank == 0:
        for _ in range(world - 1):
            queue.put(meta)
    else:
        meta = queue.get(timeout=120)
    actor_kw, rollout_kw = type(engine).build_topology(1, world - 1, [meta] + [None] * (world - 1))
    kw = actor_kw if rank == 0 else rollout_kw
    engine.init_process_group(**{k: v[0 if rank == 0 else rank - 1] for k, v in kw.items()})
    if rank == 0:
        _send(engine, w, "npu")
        results.put((0, None))
    else:
        results.put((rank, _receive(engine)))
    engine.finalize()


def npu_sync(w: dict[str, torch.Tensor], devices: int) -> list[dict]:
    """One sync over the node's first `devices` NPUs, a process each (torch.multiprocessing, spawn)."""
    import torch.multiprocessing as mp

    os.environ.setdefault("HCCL_CONNECT_TIMEOUT", "600")
    os.environ.setdefault("HCCL_EXEC_TIMEOUT", "600")
    ctx = mp.get_context("spawn")
    queue, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_npu_rank, args=(r, devices, w, queue, results)) for r in range(devices)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=600) for _ in range(devices))
    for p in procs:
        p.join(timeout=60)
    bad = [p.exitcode for p in procs if p.exitcode]
    if bad:
        raise AssertionError(f"an HCCL rank exited with {bad}")
    return [got[r] for r in range(1, devices)]


def npu_form(devices: int | None = None) -> str:
    import torch_npu  # noqa: F401

    n = devices or torch.npu.device_count()
    if n < 2:
        raise AssertionError(f"the HCCL sync needs 2 NPUs or more on the node; {n} visible")
    return check(lambda w: npu_sync(w, n), f"verl's HCCL engine over {n} NPUs")
