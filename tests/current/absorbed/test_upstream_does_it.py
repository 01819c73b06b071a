"""Published-stack patches that upstream absorbed: the current stack's pristine upstreams do it themselves.

Each test runs the current stack's unpatched upstream code on this CPU and shows the behaviour the
published patch added (patches/current/carried.toml names them). If upstream regresses, the test fails and
the patch must be carried again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import upstream_tree

pytestmark = pytest.mark.upstream


def _child(code: str, tree: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), str(tree)],
        env={**os.environ, "PYTHONPATH": str(tree), **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_megatron_saves_torch_dist_checkpoints_on_this_torch(tmp_path):
    """published megatron-dist_checkpointing-write-items-on-torch-with-serialization_format: megatron-core
    0.16.1 passes torch's `serialization_format` itself (Megatron !3243, core_v0.13.0)."""
    tree = upstream_tree("megatron")
    out = tmp_path / "ckpt"
    out.mkdir()
    proc = _child(
        f"""
        import os, sys, socket, torch
        import torch.distributed as dist
        import megatron.core
        assert os.path.realpath(megatron.core.__file__).startswith(os.path.realpath(sys.argv[1]))
        # hardware boundary: no CUDA here (the save path synchronises and asks for the current device)
        torch.cuda.synchronize = lambda *a, **k: None
        torch.cuda.current_device = lambda: "cpu"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=0, world_size=1)
        from megatron.core import dist_checkpointing
        from megatron.core.dist_checkpointing import ShardedTensor
        w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        dist_checkpointing.save({{"w": ShardedTensor.from_rank_offsets("w", w, replica_id=0)}}, {str(out)!r})
        back = dist_checkpointing.load(
            {{"w": ShardedTensor.from_rank_offsets("w", torch.zeros(3, 4), replica_id=0)}}, {str(out)!r}
        )
        assert torch.equal(back["w"], w), back["w"]
        print("saved and loaded")
        dist.destroy_process_group()
        """,
        tree,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "saved and loaded" in proc.stdout and (out / ".metadata").exists()


def test_megatron_distributed_optimizer_quantize_step_without_transformer_engine():
    """published megatron-fp8_utils-distributed-optimizer-steps-without-Transformer-Engine: without TE,
    megatron-core 0.16.1 lets a step with no FP8 parameter through (Megatron !3625, core_v0.14.0)."""
    proc = _child(
        """
        import importlib.util, sys
        assert importlib.util.find_spec("transformer_engine") is None, "this check needs TE absent"
        from megatron.core import fp8_utils
        fp8_utils.quantize_param_shard([], [], [], None)   # nothing to quantize: must not raise
        try:
            fp8_utils.quantize_param_shard([object()], [], [], None)
        except RuntimeError as e:
            print("fp8 params still refused:", e)
        """,
        upstream_tree("megatron"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fp8 params still refused" in proc.stdout
