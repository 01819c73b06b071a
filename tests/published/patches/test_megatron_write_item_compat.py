"""patches/megatron: torch_dist saves through megatron-core 0.12.1 work on torch 2.13 (the CPU profile).

Runs megatron's own `dist_checkpointing.save` / `load` from the patched tree in a child process
(gloo, world size 1). Without the patch torch 2.13 rejects megatron's `_write_item` call (TypeError:
missing 'serialization_format'). The only fakes are at the hardware boundary: `torch.cuda.synchronize`
is a no-op and `torch.cuda.current_device()` answers "cpu" on this CPU-only machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import upstream_tree

CHILD = textwrap.dedent(
    """
    import os, sys, socket, torch
    import torch.distributed as dist
    tree, out = sys.argv[1], sys.argv[2]
    import megatron.core
    assert os.path.realpath(megatron.core.__file__).startswith(os.path.realpath(tree)), megatron.core.__file__
    # hardware boundary: no CUDA here (the save path synchronises and asks for the current device)
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedTensor
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    dist_checkpointing.save({"w": ShardedTensor.from_rank_offsets("w", w, replica_id=0)}, out)
    back = dist_checkpointing.load({"w": ShardedTensor.from_rank_offsets("w", torch.zeros(3, 4), replica_id=0)}, out)
    assert torch.equal(back["w"], w), back["w"]
    print("saved and loaded", sorted(os.listdir(out)))
    dist.destroy_process_group()
    """
)


@pytest.mark.upstream
def test_torch_dist_save_through_megatron_on_this_torch(tmp_path):
    tree = upstream_tree("megatron")
    out = tmp_path / "ckpt"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tree), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "saved and loaded" in proc.stdout and (out / ".metadata").exists()
