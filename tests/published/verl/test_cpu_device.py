"""patches/verl: verl's trainer on a machine with no accelerator (docs/design.md §7).

These run the patched verl (third_party/stacks/published/verl, installed editable by `make bootstrap`) on this CPU-only
machine; no fakes. Without the patch: `get_torch_device()` is `torch.cpu`, which has no rng state or
cache calls; `get_nccl_backend()` raises; the process-group backend string is the invalid
"cpu:gloo,cpu:nccl"; Ray placement bundles ask for a "cpu" resource no cluster has; the resource check
counts no GPUs and refuses; the actor model asks for flash-attn.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import pytest

from tests import verl_cpu as vc

pytestmark = pytest.mark.upstream


patched_verl = pytest.fixture(scope="module", autouse=True, name="patched_verl")(vc.assert_patched_verl)


def test_device_module_answers_what_verl_asks() -> None:
    from verl.utils.device import get_device_name, get_torch_device

    assert get_device_name() == "cpu"
    dev = get_torch_device()
    vc.check_device_module(dev)
    assert dev.get_device_name() == "cpu"


def test_process_group_backend_is_gloo() -> None:
    from verl.utils.device import get_cpu_and_device_backend, get_nccl_backend

    assert get_nccl_backend() == "gloo"
    assert get_cpu_and_device_backend() == "gloo"
    # the string verl's workers pass is one torch accepts: start a one-rank group with it
    code = textwrap.dedent(
        """
        import sys, torch, torch.distributed as dist
        from verl.utils.device import get_cpu_and_device_backend
        dist.init_process_group(get_cpu_and_device_backend(), init_method=sys.argv[1], rank=0, world_size=1)
        t = torch.ones(2); dist.all_reduce(t); assert t.tolist() == [1.0, 1.0]
        dist.destroy_process_group()
        """
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = subprocess.run(
        [sys.executable, "-c", code, f"tcp://127.0.0.1:{port}"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-3000:]


def test_default_attention_is_sdpa_on_cpu() -> None:
    from verl.utils.device import get_default_attn_implementation

    assert get_default_attn_implementation() == "sdpa"


def test_ray_bundles_ask_only_for_cpu(monkeypatch) -> None:
    from verl.single_controller.ray.base import RayResourcePool

    captured = vc.record_bundles(monkeypatch)
    RayResourcePool([2], use_gpu=True, max_colocate_count=1).get_placement_groups(device_name="cpu")
    assert captured["bundles"] == [{"CPU": 1}, {"CPU": 1}]
    # with an accelerator the bundle still asks for it, as upstream does
    RayResourcePool([1], use_gpu=True, max_colocate_count=1).get_placement_groups(device_name="cuda")
    assert captured["bundles"] == [{"CPU": 1, "GPU": 1}]


def test_resource_check_counts_cpus_without_accelerators(monkeypatch) -> None:
    from verl.trainer.ppo.ray_trainer import ResourcePoolManager

    nodes = vc.check_resource_count_on_cpus(monkeypatch, ResourcePoolManager)
    # a cluster with accelerators keeps upstream's count of GPUs
    nodes["node-a"]["GPU"] = 1.0
    with pytest.raises(ValueError, match="less than total desired"):
        ResourcePoolManager({"global_pool": [2]}, {})._check_resource_available()
