"""verl patch `verl-vllm-rollout-place-the-server-by-the-worker-s-local-rank-on-CPU` (current stack).

verl 0.9.1's vLLMReplica.launch_servers asks every hybrid worker (in a Ray actor) for
`ray.get_runtime_context().get_accelerator_ids()[get_resource_name()][0]`, the GPU/NPU index Ray gave it,
to build the server's visible-devices list. A worker on the CPU platform has no accelerator ids ("CPU" is
no accelerator resource): KeyError, and the rollout never starts. The patch answers the worker's
LOCAL_RANK there. This drives the real launch_servers with a worker that answers as Ray answers in a CPU-only actor
(no Ray cluster is started: Ray's own start-up is the slow part on a loaded machine).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from tests.conftest import upstream_tree

pytestmark = pytest.mark.upstream


class _Stop(Exception):
    pass


class _CpuActorContext:
    """What `ray.get_runtime_context()` answers inside an actor that holds only CPUs: its node, and
    accelerator ids for Ray's accelerator resources only (never "CPU"), all empty."""

    def get_node_id(self) -> str:
        return "node-0"

    def get_accelerator_ids(self) -> dict[str, list[str]]:
        return {"GPU": [], "NPU": [], "TPU": [], "HPU": [], "neuron_cores": []}


class _Ref:
    def __init__(self, value):
        self.value = value

    def __await__(self):
        if False:
            yield
        return self.value


class _Worker:
    """A hybrid worker handle: `__ray_call__.remote(fn)` runs fn as Ray runs it in the actor."""

    class _Call:
        @staticmethod
        def remote(fn):
            return _Ref(fn(None))

    __ray_call__ = _Call()


def test_launch_servers_gets_a_device_list_from_cpu_workers(monkeypatch) -> None:
    import asyncio

    import ray
    from verl.workers.rollout.vllm_rollout import vllm_async_server as srv

    assert os.path.realpath(srv.__file__).startswith(os.path.realpath(upstream_tree("verl")))
    monkeypatch.setattr(ray, "get_runtime_context", _CpuActorContext)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(
        ray.util, "scheduling_strategies", SimpleNamespace(NodeAffinitySchedulingStrategy=dict)
    )

    recorded: dict = {}

    class Server:  # records what launch_servers would start the vLLM server with, then stops it
        @staticmethod
        def options(**kwargs):
            recorded["options"] = kwargs
            return Server

        @staticmethod
        def remote(**kwargs):
            recorded.update(kwargs)
            raise _Stop

    class Replica(srv.vLLMReplica):
        def __init__(self, workers):  # only what launch_servers reads
            self.workers, self.world_size, self.nnodes, self.gpus_per_replica_node = workers, 1, 1, 1
            self.is_reward_model = self.is_teacher_model = False
            self.replica_rank, self.name_suffix, self.servers = 0, "", []
            self.config = self.model_config = self.rollout_mode = None
            self.server_class = Server

        @property
        def max_concurrency(self) -> int:
            return 1

    worker = _Worker()
    with pytest.raises(_Stop):
        asyncio.run(Replica([worker]).launch_servers())
    assert recorded["cuda_visible_devices"] == "0"
    assert recorded["workers"] == [worker]
