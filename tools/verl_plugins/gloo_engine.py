"""A CPU checkpoint engine for verl 0.9.1: the trainer's weights to standalone rollout replicas over gloo.

verl's `separate_async` trainer (recipes/mode/separate_async.yaml) sends the actor's weights to rollout
replicas on other devices through a checkpoint engine after every step, and refuses the colocated `naive`
engine. Its engines (nccl, hccl, nixl, mooncake, kimi) all need an accelerator or an RDMA stack, so on CPU
nothing can sync. This engine registers itself as "gloo" in verl's own registry
(`verl.checkpoint_engine.CheckpointEngineRegistry`) and is loaded the way verl loads third-party engines:
`actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=tools.verl_plugins.gloo_engine` (verl imports
the module in the actor workers, the rollout's checkpoint-engine workers and the trainer's manager before
it looks the backend up). No verl patch.

How a sync goes (verl's CheckpointEngineManager.update_weights drives it):
  prepare()            actor rank 0 (the master) starts the group's TCPStore on a port the kernel picks;
                       every worker allocates one bucket
  build_topology()     actor rank 0 -> gloo rank 0 (the only sender), other actor ranks -> -1 (they walk the
                       weight generator, whose gathers are collective over the actor's groups, and drop
                       it), rollout workers -> ranks 1..n
  init_process_group() a private gloo group over a fresh TCPStore: it never touches the actor's own
                       default group (Megatron's), so a sync cannot interleave with training collectives
  send_weights()       verl's split_weight_chunks fills the bucket; for each full bucket: broadcast a
                       header (length of the pickled metadata), the metadata, then the bucket's bytes
  receive_weights()    the same three broadcasts; verl's merge_weight_chunks re-assembles tensors larger
                       than a bucket; each bucket is copied before it is handed on, so the consumer (the
                       vLLM server adapter) may keep views while the next bucket arrives
  finalize()           the group and the store are dropped (rebuilt next sync: ranks may move)

Blocking gloo calls run in a worker thread (asyncio.to_thread) so the rollout's event loop keeps serving
the server adapter's own coroutines, as verl's NCCL engine does with run_in_executor.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import pickle
import time
from collections.abc import AsyncGenerator, Generator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from verl.checkpoint_engine.base import (
    CheckpointEngine,
    CheckpointEngineRegistry,
    TensorMeta,
    merge_weight_chunks,
    split_weight_chunks,
)

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

BACKEND = "gloo"


@dataclass
class MasterAddress:
    """Where the sender's TCPStore listens (actor rank 0's `prepare`)."""

    host: str
    port: int


def _host() -> str:
    """This node's address for the store: Ray's node address when in a Ray worker, else loopback."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address().strip("[]")
    except Exception:  # noqa: BLE001 - outside Ray (tests): loopback
        pass
    return "127.0.0.1"


@CheckpointEngineRegistry.register(BACKEND)
class GlooCheckpointEngine(CheckpointEngine):
    """Bucketed broadcast of the actor's weights over a private gloo group (CPU).

    Args:
        bucket_size: bytes a bucket holds (verl passes update_weights_bucket_megabytes << 20).
        is_master: True in actor rank 0, the sender (verl passes it to actor workers only).
        timeout_s: gloo's timeout for each collective and for the store's rendezvous.
    """

    def __init__(self, bucket_size: int, is_master: bool = False, timeout_s: float = 600.0, **_: Any) -> None:
        self.bucket_size = int(bucket_size)
        self.is_master = is_master
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.rank: int | None = None
        self.world_size: int | None = None
        self.group: dist.ProcessGroup | None = None
        self.store: dist.TCPStore | None = None
        self.bucket: torch.Tensor | None = None
        self.master: MasterAddress | None = None
        self.last_sync: dict[str, float] = {}

    # ---- verl's CheckpointEngine interface ---------------------------------------------------------

    def prepare(self) -> MasterAddress | None:
        self.bucket = torch.empty(self.bucket_size, dtype=torch.uint8)
        if self.is_master:
            # the store listens from here on, on a port the kernel picks: a port picked free and bound
            # later can be taken in between (EADDRINUSE, seen once in three separate_async runs on CPU)
            host = _host()
            self.store = dist.TCPStore(
                host, 0, None, is_master=True, timeout=self.timeout, wait_for_workers=False
            )
            self.master = MasterAddress(host=host, port=int(self.store.port))
            return self.master
        return None

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[Any]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        master = metadata[0]
        if not isinstance(master, MasterAddress):
            raise RuntimeError(
                f"gloo checkpoint engine: actor rank 0 did not report the store's address (got {master!r}); "
                "verl creates the actor's engine with is_master=(rank == 0)"
            )
        world_size = 1 + rollout_world_size
        actor = {
            "rank": [0] + [-1] * (actor_wg_world_size - 1),
            "world_size": [world_size] * actor_wg_world_size,
            "master": [master] * actor_wg_world_size,
        }
        rollout = {
            "rank": list(range(1, world_size)),
            "world_size": [world_size] * rollout_world_size,
            "master": [master] * rollout_world_size,
        }
        return actor, rollout

    def init_process_group(self, rank: int, world_size: int, master: MasterAddress) -> None:
        self.rank, self.world_size = rank, world_size
        if rank < 0:
            return
        if rank > 0:
            self.store = dist.TCPStore(
                master.host, master.port, world_size, is_master=False, timeout=self.timeout
            )
        elif self.store is None:
            raise RuntimeError(
                "gloo checkpoint engine: rank 0 joins the group before prepare() made its store"
            )
        self.group = dist.ProcessGroupGloo(self.store, rank, world_size, self.timeout)

    def finalize(self) -> None:
        self.group = None
        self.store = None
        self.bucket = None

    @torch.no_grad()
    async def send_weights(
        self, weights: Generator[tuple[str, torch.Tensor], None, None], global_steps: int | None = None
    ) -> dict[str, float]:
        if self.rank is None:
            raise RuntimeError("gloo checkpoint engine: send_weights before init_process_group")
        if self.rank < 0:
            # not a sender: walk the generator anyway, its gathers are collective over the actor's groups
            async for _ in split_weight_chunks(weights, self.bucket_size, meta_only=True):
                pass
            return {}
        assert self.rank == 0, "only gloo rank 0 sends"
        start = time.perf_counter()
        sent = 0
        buckets = 0
        meta: dict[str, TensorMeta] = {}
        offset = 0
        async for tensor_meta, chunk in split_weight_chunks(weights, self.bucket_size):
            if offset + tensor_meta.chunk_size > self.bucket_size:
                await asyncio.to_thread(self._broadcast_bucket, meta, offset, False)
                sent += offset
                buckets += 1
                meta, offset = {}, 0
            tensor_meta.offset = offset
            # a tensor larger than a bucket comes in several chunks of the same name: keep each chunk
            meta[f"{tensor_meta.name}@{tensor_meta.chunk_offset}"] = tensor_meta
            self.bucket[offset : offset + tensor_meta.chunk_size] = chunk.detach().to("cpu")
            offset += tensor_meta.chunk_size
        await asyncio.to_thread(self._broadcast_bucket, meta, offset, True)
        sent += offset
        buckets += 1
        seconds = time.perf_counter() - start
        self.last_sync = {"bytes": float(sent), "buckets": float(buckets), "seconds": seconds}
        logger.info("gloo checkpoint engine: sent %d bytes in %d buckets, %.3f s", sent, buckets, seconds)
        return {
            "weight_sync/gloo/bytes": float(sent),
            "weight_sync/gloo/buckets": float(buckets),
            "weight_sync/gloo/seconds": seconds,
        }

    @torch.no_grad()
    async def receive_weights(
        self, global_steps: int | None = None
    ) -> AsyncGenerator[tuple[str, torch.Tensor]]:
        if self.rank is None or self.rank < 1:
            raise RuntimeError(
                f"gloo checkpoint engine: receive_weights on rank {self.rank}: rollout ranks are >= 1"
            )
        async for name, tensor in merge_weight_chunks(self._receive_chunks(), self.bucket_size):
            yield name, tensor

    # ---- the wire --------------------------------------------------------------------------------

    def _broadcast_bucket(self, meta: dict[str, TensorMeta], length: int, is_last: bool) -> None:
        """Rank 0: header (metadata length), pickled metadata, then the bucket's first `length` bytes."""
        payload = pickle.dumps({"meta": list(meta.values()), "is_last": is_last, "length": length})
        header = torch.tensor([len(payload)], dtype=torch.int64)
        self.group.broadcast(header, 0).wait()
        self.group.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8), 0).wait()
        if length:
            self.group.broadcast(self.bucket[:length], 0).wait()

    def _receive_bucket(self) -> dict[str, Any]:
        header = torch.zeros(1, dtype=torch.int64)
        self.group.broadcast(header, 0).wait()
        raw = torch.empty(int(header.item()), dtype=torch.uint8)
        self.group.broadcast(raw, 0).wait()
        info = pickle.loads(raw.numpy().tobytes())
        if info["length"]:
            self.group.broadcast(self.bucket[: info["length"]], 0).wait()
        info["data"] = self.bucket[: info["length"]]
        return info

    async def _receive_chunks(self) -> AsyncGenerator[tuple[TensorMeta, torch.Tensor]]:
        while True:
            info = await asyncio.to_thread(self._receive_bucket)
            data = info["data"]
            for m in info["meta"]:
                # its own storage: merge_weight_chunks views the bytes as the tensor's dtype, which needs an
                # offset aligned to it (a bf16 tensor of odd length before an fp32 one would not be)
                yield m, data[m.offset : m.offset + m.chunk_size].clone()
            if info["is_last"]:
                return
