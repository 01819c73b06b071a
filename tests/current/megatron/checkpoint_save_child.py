"""One gloo rank saving a small sharded state dict with megatron-core's torch_dist strategy as verl 0.9.1
does (FullyParallelSaveStrategyWrapper around TorchDistSaveShardedStrategy), synchronously or as an async
request executed here, for tests/current/megatron/test_checkpoint_save.py.

    python -m tests.current.megatron.checkpoint_save_child <sync|async> <port> <out dir>

Writes <out dir>/report.json: where filesystem_async came from, whether its write-results queue is the
spawned Manager's, the processes this one left running, and whether the checkpoint loads back equal.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys

import torch


def main() -> int:
    mode, port, out = sys.argv[1], sys.argv[2], sys.argv[3]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", WORLD_SIZE="1")
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedTensor
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    torch.manual_seed(0)
    tensors = {"a": torch.randn(16, 8), "b": torch.randn(32)}

    def sharded(values):
        return {k: ShardedTensor.from_rank_offsets(k, v, replica_id=0) for k, v in values.items()}

    strategy = FullyParallelSaveStrategyWrapper(TorchDistSaveShardedStrategy("torch_dist", 1))
    path = os.path.join(out, "ckpt")
    os.makedirs(path)
    if mode == "sync":
        dist_checkpointing.save(sharded(tensors), path, sharded_strategy=strategy)
    else:
        request = dist_checkpointing.save(
            sharded(tensors), path, sharded_strategy=strategy, async_sharded_save=True
        )
        request.execute_sync()
    left_running = sorted(p.name for p in multiprocessing.active_children())
    loaded = dist_checkpointing.load(sharded({k: torch.zeros_like(v) for k, v in tensors.items()}), path)
    report = {
        "module": filesystem_async.__file__,
        "manager_queue": filesystem_async._results_queue is not None,
        "left_running": left_running,
        "loads_back_equal": all(torch.equal(loaded[k], v) for k, v in tensors.items()),
    }
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f)
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
