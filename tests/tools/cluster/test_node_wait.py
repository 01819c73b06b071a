"""`make ray-job`'s supervisor on a cluster (tools/cluster/node_wait.py, tools/launch/train.py): a node lost
names the fault, a restart waits for the node or a replacement up to launch.ray.node_wait_s, and a node that
does not come back in time ends the run with exit 3 naming it. The launcher's loop with a fake verl and a
fake node list (tests/tools/launch/test_restart.py's); the same on real raylets:
tests/tools/cluster/test_ray_job_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from tests.tools.launch.test_restart import DIED, _verl, fake  # noqa: F401 (fake: a fixture)
from tools.cluster import node_wait
from tools.cluster.ray_cluster import ClusterError, Node
from tools.errors import MACHINE_FAULT, UserError, exit_status
from tools.launch import shared_storage, train
from tools.launch.restart import Fault
from tools.launch.run import TrainError

HEAD = "10.0.0.1:6766"


class Nodes:
    """The cluster's node list as `ray list nodes` gives it, changed by the test as it goes."""

    def __init__(self) -> None:
        self.up = {"a": Node("10.0.0.1", True, 16, "a" * 28), "b": Node("10.0.0.2", True, 16, "b" * 28)}
        self.polls = 0
        self.back_after: int | None = None  # the lost node (or a replacement) joins after this many polls

    def __call__(self, address: str, resource: str) -> list[Node]:
        assert address == HEAD
        self.polls += 1
        if self.back_after is not None and self.polls > self.back_after:
            self.up["c"] = Node("10.0.0.3", True, 16, "c" * 28)  # a replacement, another id
        return list(self.up.values())

    def lose(self, key: str) -> None:
        self.polls = 0
        self.up[key] = Node(self.up[key].address, False, 16, self.up[key].node_id)


def _cluster(nodes: Nodes, wait_s: float = 5.0) -> node_wait.Cluster:
    return node_wait.Cluster(HEAD, 2, 16, "NPU", wait_s, lister=nodes, poll_s=0.05, death_s=0.2)


def test_a_lost_node_names_the_fault_and_a_replacement_ends_the_wait() -> None:
    nodes = Nodes()
    cluster = _cluster(nodes)
    before = cluster.alive()
    nodes.lose("b")
    fault = cluster.name_lost(Fault("worker lost", "WorkerDict pid=5", DIED, 3), before)
    assert fault == Fault("node lost", "node 10.0.0.2 (Ray node bbbbbbbbbbbb)", DIED, 3) and fault.recoverable
    assert cluster.name_lost(Fault("config", "x", "y", 3), before).kind == "config"  # the user's, still
    assert cluster.name_lost(Fault("stall", "x", "", 3), cluster.alive()).kind == "stall"  # nobody left

    def unanswered(address: str, resource: str) -> list[Node]:
        raise ClusterError("cannot list the nodes")

    silent = node_wait.Cluster(HEAD, 2, 16, "NPU", 5.0, lister=unanswered)
    assert silent.lost(before) == [] and silent.alive() == []  # no answer: no node named lost
    nodes.back_after, nodes.polls = 3, 0
    assert cluster.wait_back(fault) is None and nodes.polls == 4  # waited until the replacement joined
    nodes.lose("c")
    nodes.back_after = None
    why = _cluster(nodes, wait_s=0.3).wait_back(fault)
    assert why is not None and why.startswith(
        "node 10.0.0.2 (Ray node bbbbbbbbbbbb) lost, and neither it nor a replacement with 16 NPU joined within"
        " 0.3 s (launch.ray.node_wait_s): after 0.3 s, 1 of 2 nodes joined with 16 NPU each"
    )


def test_a_node_marked_dead_after_verl_failed_is_still_named() -> None:
    nodes = Nodes()
    cluster = node_wait.Cluster(HEAD, 2, 16, "NPU", 5.0, lister=nodes, poll_s=0.05, death_s=5.0)
    before = cluster.alive()
    real = nodes.__call__

    def later(address: str, resource: str) -> list[Node]:  # Ray marks b dead on the fourth look
        if nodes.polls == 3:
            nodes.lose("b")
            nodes.polls = 3
        return real(address, resource)

    cluster = node_wait.Cluster(HEAD, 2, 16, "NPU", 5.0, lister=later, poll_s=0.05, death_s=5.0)
    nodes.polls = 0
    fault = cluster.name_lost(
        Fault("worker lost", "TaskRunner pid=5", "ActorUnavailableError: ...", 2), before
    )
    assert fault.kind == "node lost" and fault.process == "node 10.0.0.2 (Ray node bbbbbbbbbbbb)"
    assert nodes.polls == 4


def test_the_wait_key_is_checked_with_a_stated_default() -> None:
    launch = OmegaConf.create({"nodes": 4, "devices_per_node": 16, "ray": {"resource": "NPU"}})
    c = node_wait.Cluster.of(launch, HEAD)
    assert (c.nodes, c.devices, c.resource, c.wait_s) == (4, 16, "NPU", node_wait.NODE_WAIT_S)
    assert node_wait.NODE_WAIT_S == 900
    for bad in (0, -5, "soon", True):
        launch.ray.node_wait_s = bad
        with pytest.raises(UserError, match="launch.ray.node_wait_s"):
            node_wait.Cluster.of(launch, HEAD)


# the launcher's loop on a cluster, with a fake verl ---------------------------------------------------------


def _on_cluster(monkeypatch, nodes: Nodes, script: list, lose_in: int, wait_s: float) -> list:
    """`cluster job` against the fake cluster: node b is lost during attempt `lose_in`; what each attempt's
    verl was given (argv, env)."""
    monkeypatch.setattr(
        train.node_wait.Cluster, "of", classmethod(lambda cls, launch, address: _cluster(nodes, wait_s))
    )
    calls: list = []
    fake_verl = _verl(script, calls)
    given: list = []

    def run_verl(argv, env, run, attempt, out, *watch):
        given.append((list(argv), dict(env)))
        if len(given) == lose_in:
            nodes.lose("b")
        return fake_verl(argv, env, run, attempt, out, *watch)

    monkeypatch.setattr(train, "run_verl", run_verl)
    # the fake cluster has 2 nodes: both see the checkpoint folder (tests below: one does not)
    monkeypatch.setattr(
        shared_storage,
        "ray_reader",
        lambda m, address: {"10.0.0.1": m.read_text(), "10.0.0.2": m.read_text()},
    )
    return given


def _job(*args: str) -> list[str]:
    return ["--recipe", "tiny-cpu", "--no-plan", "launch.steps=4", "launch.restarts=1", *args]


def _run(argv: list[str]) -> int:
    from tools.cluster import ray_job

    return exit_status(ray_job.main, ["--address", HEAD, *argv])


def test_a_node_lost_mid_run_is_waited_for_and_the_run_restarts(fake, monkeypatch, capsys) -> None:  # noqa: F811
    nodes = Nodes()
    given = _on_cluster(monkeypatch, nodes, [(1, [1, 2], DIED), (0, [3, 4], "")], lose_in=1, wait_s=5)
    nodes.back_after = 2  # a replacement joins on the third poll of the wait
    assert _run(_job()) == 0
    said = capsys.readouterr().out
    assert "make ray-job: verl's driver attaches to the Ray cluster at 10.0.0.1:6766" in said
    assert "node lost at step 3: restarting (1 of launch.restarts 1)" in said
    assert "waiting: 1 of 2 nodes with 16 NPU" in said and "cluster ready: 2 nodes x 16 NPU" in said
    rows = [json.loads(x) for x in next(fake.glob("*/tiny-cpu/metrics.jsonl")).read_text().splitlines()]
    (r,) = [r for r in rows if r["kind"] == "restart"]
    assert (r["cause"], r["process"], r["resumed_from"]) == (
        "node lost",
        "node 10.0.0.2 (Ray node bbbbbbbbbbbb)",
        2,
    )
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4]
    # verl's driver attached to the cluster, not a Ray of its own; the run's environment reaches the workers
    for attempt, (argv, env) in enumerate(given, 1):
        assert env["RAY_ADDRESS"] == HEAD and "++ray_kwargs.ray_init.address=local" not in argv
        assert "++ray_kwargs.ray_init.num_cpus=null" in argv
        runtime = next(a for a in argv if a.startswith("++ray_kwargs.ray_init.runtime_env="))
        workers = (
            OverridesParser.create().parse_override(runtime).value()["env_vars"]
        )  # as verl's Hydra reads it
        assert (
            workers["VERL_FILE_LOGGER_PATH"] == env["VERL_FILE_LOGGER_PATH"]
            and workers["CUDA_VISIBLE_DEVICES"] == ""
        )
        assert env["VERL_FILE_LOGGER_PATH"].endswith(f"verl-metrics-{attempt}.jsonl")


def test_a_node_that_does_not_come_back_ends_the_run_with_exit_3_naming_it(fake, monkeypatch, capsys) -> None:  # noqa: F811
    nodes = Nodes()
    given = _on_cluster(monkeypatch, nodes, [(1, [1, 2], DIED)], lose_in=1, wait_s=0.3)
    assert _run(_job()) == MACHINE_FAULT and len(given) == 1
    captured = capsys.readouterr()
    assert (
        "no restart: node 10.0.0.2 (Ray node bbbbbbbbbbbb) lost, and neither it nor a replacement with 16 NPU"
        " joined within 0.3 s (launch.ray.node_wait_s)" in captured.out
    )
    assert "error: the run failed: node lost at step 3 (first error: node 10.0.0.2" in captured.err
    assert "make ray-job RECIPE=tiny-cpu HEAD=10.0.0.1:6766` resumes" in captured.err


def test_a_job_of_several_nodes_checks_the_shared_checkpoint_folder_first(fake, monkeypatch) -> None:  # noqa: F811
    nodes = Nodes()
    given = _on_cluster(monkeypatch, nodes, [(0, [1], "")], lose_in=0, wait_s=1)
    read: list[Path] = []

    def own_disk(marker: Path, address: str) -> dict[str, str | None]:
        read.append(marker)
        return {"10.0.0.1": marker.read_text(), "10.0.0.2": None}

    monkeypatch.setattr(shared_storage, "ray_reader", own_disk)
    with pytest.raises(TrainError, match=r"10.0.0.2: no such file"):
        from tools.cluster import ray_job

        ray_job.main(["--address", HEAD, *_job("launch.nodes=2")])
    assert given == [] and read[0].parent.name == "checkpoints"  # the run folder's, where verl saves
