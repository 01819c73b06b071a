"""patches/verl: verl's trainer on a machine with no accelerator (PATCHES.md section 7).

These run the patched verl (third_party/verl, installed editable by `make bootstrap`) on this CPU-only
machine; no fakes. Without the patch: `get_torch_device()` is `torch.cpu`, which has no rng state or
cache calls; `get_nccl_backend()` raises; the process-group backend string is the invalid
"cpu:gloo,cpu:nccl"; Ray placement bundles ask for a "cpu" resource no cluster has; the resource check
counts no GPUs and refuses; the actor model asks for flash-attn.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.conftest import upstream_tree

pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module", autouse=True)
def patched_verl():
    tree = upstream_tree("verl")
    import verl

    assert os.path.realpath(verl.__file__).startswith(os.path.realpath(tree)), verl.__file__
    assert not torch.cuda.is_available()


def test_device_module_answers_what_verl_asks() -> None:
    from verl.utils.device import get_device_name, get_torch_device

    assert get_device_name() == "cpu"
    dev = get_torch_device()
    dev.manual_seed(7)
    state = dev.get_rng_state()
    a = torch.rand(3)
    dev.set_rng_state(state)
    assert torch.equal(torch.rand(3), a)  # the CPU generator is what verl saves and restores
    dev.empty_cache()
    dev.reset_peak_memory_stats()
    assert dev.memory_allocated() == 0 and dev.max_memory_reserved() == 0
    free, total = dev.mem_get_info()
    assert 0 < free <= total
    assert dev.current_device() == torch.cpu.current_device()
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
    import verl.single_controller.ray.base as base
    from verl.single_controller.ray.base import RayResourcePool

    captured = {}

    class FakePG:  # Ray's placement group, recorded (no cluster here)
        def ready(self):
            return None

    def fake_pg(bundles, strategy, name, lifetime):
        captured["bundles"] = bundles
        return FakePG()

    monkeypatch.setattr(base, "placement_group", fake_pg)
    monkeypatch.setattr(base.ray, "get", lambda refs, **_: refs)
    RayResourcePool([2], use_gpu=True, max_colocate_count=1).get_placement_groups(device_name="cpu")
    assert captured["bundles"] == [{"CPU": 1}, {"CPU": 1}]
    # with an accelerator the bundle still asks for it, as upstream does
    RayResourcePool([1], use_gpu=True, max_colocate_count=1).get_placement_groups(device_name="cuda")
    assert captured["bundles"] == [{"CPU": 1, "GPU": 1}]


def test_resource_check_counts_cpus_without_accelerators(monkeypatch) -> None:
    import ray
    from verl.trainer.ppo.ray_trainer import ResourcePoolManager

    nodes = {"node-a": {"CPU": 6.0, "memory": 1e9}}
    monkeypatch.setattr(ray._private.state, "available_resources_per_node", lambda: nodes)
    ResourcePoolManager({"global_pool": [2]}, {})._check_resource_available()  # fits: no error
    with pytest.raises(ValueError, match="less than total desired"):
        ResourcePoolManager({"global_pool": [8]}, {})._check_resource_available()
    # a cluster with accelerators keeps upstream's count of GPUs
    nodes["node-a"]["GPU"] = 1.0
    with pytest.raises(ValueError, match="less than total desired"):
        ResourcePoolManager({"global_pool": [2]}, {})._check_resource_available()
