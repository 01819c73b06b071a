"""What the tests of each stack's verl-on-CPU patch share (tests/published/verl/test_cpu_device.py,
tests/current/patches/test_verl_cpu_platform.py): the patched tree in use, and the checks of verl's device
module, Ray bundles and resource count that hold on both. Each test module keeps its own tests.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from tests.conftest import upstream_tree


def assert_patched_verl() -> None:
    """verl is imported from this stack's patched tree, on a machine torch sees no accelerator on (the
    body of the test modules' autouse `patched_verl` fixture)."""
    tree = upstream_tree("verl")
    import verl

    assert os.path.realpath(verl.__file__).startswith(os.path.realpath(tree)), verl.__file__
    assert not torch.cuda.is_available()


def check_device_module(dev: Any) -> None:
    """verl's device module (`get_torch_device()`) answers the calls verl makes on it, on the CPU."""
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


def record_bundles(monkeypatch) -> dict[str, Any]:
    """Ray's placement groups in verl.single_controller.ray.base replaced by a recorder (no cluster here):
    the returned dict's "bundles" is what the last placement group asked for."""
    import verl.single_controller.ray.base as base

    captured: dict[str, Any] = {}

    class FakePG:  # Ray's placement group, recorded
        def ready(self):
            return None

    def fake_pg(bundles, strategy, name, lifetime):
        captured["bundles"] = bundles
        return FakePG()

    monkeypatch.setattr(base, "placement_group", fake_pg)
    monkeypatch.setattr(base.ray, "get", lambda refs, **_: refs)
    return captured


def check_resource_count_on_cpus(monkeypatch, manager: type) -> dict[str, dict[str, float]]:
    """verl's resource check (`manager`: its ResourcePoolManager) counts the CPUs of a cluster with no
    accelerator: 2 of 6 fit, 8 are refused. The cluster's nodes, for more checks (Ray's view of them is
    the dict itself)."""
    import ray

    nodes = {"node-a": {"CPU": 6.0, "memory": 1e9}}
    monkeypatch.setattr(ray._private.state, "available_resources_per_node", lambda: nodes)
    manager({"global_pool": [2]}, {})._check_resource_available()  # fits: no error
    with pytest.raises(ValueError, match="less than total desired"):
        manager({"global_pool": [8]}, {})._check_resource_available()
    return nodes
