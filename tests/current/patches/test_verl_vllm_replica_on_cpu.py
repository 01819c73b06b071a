"""verl patch `verl-vllm-rollout-place-the-server-by-the-worker-s-local-rank-on-CPU` (current stack).

verl 0.9.1's vLLMReplica.launch_servers asks every hybrid worker (in a Ray actor) for
`ray.get_runtime_context().get_accelerator_ids()[get_resource_name()][0]`, the GPU/NPU index Ray gave it,
to build the server's visible-devices list. A worker on the CPU platform has no accelerator ids ("CPU" is
no accelerator resource): KeyError, and the rollout never starts. The patch answers the worker's
LOCAL_RANK there. This drives the real launch_servers against a real one-CPU Ray actor.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import upstream_tree

pytestmark = pytest.mark.upstream


class _Stop(Exception):
    pass


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    import ray

    assert not ray.is_initialized()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _temp_dir=str(tmp_path_factory.mktemp("ray")),
        runtime_env={"env_vars": {"LOCAL_RANK": "0"}},
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()


def test_launch_servers_gets_a_device_list_from_cpu_workers(ray_cluster) -> None:
    import asyncio

    from verl.workers.rollout.vllm_rollout import vllm_async_server as srv

    assert os.path.realpath(srv.__file__).startswith(os.path.realpath(upstream_tree("verl")))

    @ray_cluster.remote(num_cpus=1)
    class Worker:  # stands in for verl's hybrid actor/rollout worker (a Ray actor on one CPU slot)
        def ping(self):
            return True

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

    worker = Worker.remote()
    ray_cluster.get(worker.ping.remote())
    with pytest.raises(_Stop):
        asyncio.run(Replica([worker]).launch_servers())
    assert recorded["cuda_visible_devices"] == "0"
    assert recorded["workers"] == [worker]
