"""verl patch `verl-platform-a-CPU-platform-for-machines-with-no-accelerator` (current stack).

verl 0.9.1 picks its device through a platform layer (verl/plugin/platform) that knows CUDA, ROCm and NPU
and falls back to the nvidia platform on a machine with none: `get_device_name()` is then "cuda", the
process-group backend "cpu:gloo,cuda:nccl", the device module `torch.cuda`, Ray bundles ask for a "GPU"
and the resource check counts no GPUs ("Total available GPUs 0", verl issue 3266). The patch adds a CPU
platform, probed last, that answers "cpu", gloo, a `torch.cpu`-based device module and CPU Ray resources.
These run the patched tree (current's verl tree) on this CPU-only machine; no fakes for verl itself.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

from tests import verl_cpu as vc

pytestmark = pytest.mark.upstream


patched_verl = pytest.fixture(scope="module", autouse=True, name="patched_verl")(vc.assert_patched_verl)


def test_platform_is_cpu_without_an_accelerator() -> None:
    from verl.plugin.platform import get_platform
    from verl.utils.device import get_device_name, get_nccl_backend

    assert get_platform().device_name == "cpu"
    assert get_device_name() == "cpu"
    assert get_nccl_backend() == "gloo"
    assert get_platform().ray_resource_name() == "CPU"


def test_device_module_answers_what_verl_asks() -> None:
    from verl.utils.device import get_torch_device

    vc.check_device_module(get_torch_device())


def test_verls_process_group_comes_up_on_gloo() -> None:
    """verl's own initialize_global_process_group_ray, one rank, in a fresh process."""
    code = textwrap.dedent(
        """
        import torch, torch.distributed as dist
        from verl.utils.distributed import initialize_global_process_group_ray
        initialize_global_process_group_ray(timeout_second=60)
        assert dist.get_backend() == "gloo", dist.get_backend()
        t = torch.ones(2); dist.all_reduce(t); assert t.tolist() == [1.0, 1.0]
        dist.destroy_process_group()
        """
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(
        os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    env.pop("VERL_PLATFORM", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def test_ray_bundles_ask_only_for_cpu(monkeypatch) -> None:
    import verl.single_controller.ray.base as base
    from verl.single_controller.ray.base import RayResourcePool

    captured = vc.record_bundles(monkeypatch)
    monkeypatch.setattr(base, "sort_placement_group_by_node_ip", lambda pgs: pgs)
    RayResourcePool([2], use_gpu=True, max_colocate_count=1).get_placement_groups(device_name="cpu")
    assert captured["bundles"] == [{"CPU": 1}, {"CPU": 1}]


def test_resource_check_counts_cpus_on_the_cpu_platform(monkeypatch) -> None:
    from verl.single_controller.ray.base import ResourcePoolManager

    vc.check_resource_count_on_cpus(monkeypatch, ResourcePoolManager)


def test_an_accelerator_platform_keeps_upstreams_choice(monkeypatch) -> None:
    """The gate: with an accelerator build of torch the CPU platform declines, so GPU/NPU machines keep
    the platform upstream picks."""
    from verl.plugin.platform.platform_cpu import PlatformCPU

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert not PlatformCPU().is_platform_available(use_smi_check=True)
