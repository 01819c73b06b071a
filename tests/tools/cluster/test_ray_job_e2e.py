"""`make ray-job` on real raylets of this machine (tools/cluster/ray_job.py, node_wait.py): a head with no CPU
for work and a second raylet with the run's 8 CPU slots, so that every Ray worker of the run (verl's
TaskRunner, the Megatron and vLLM workers) lives on the second one. That raylet is killed mid-run (every
process of its temp dir, as a node lost), and:
- brought back: the supervisor names the lost node, waits, restarts from the last checkpoint and the run
  finishes by itself, the restart in metrics.jsonl;
- never brought back: the supervisor stops after launch.ray.node_wait_s with exit 3, naming the node.
The logic alone, with a fake verl and a fake node list, is tests/tools/cluster/test_node_wait.py (in CI)."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import STACK
from tests.outside_ci import outside_ci
from tests.tools.cluster.test_cluster import _cli, _node_flags, ray_env  # noqa: F401 (ray_env: a fixture)
from tests.train_e2e import metrics, stop_run
from tools.cluster import ray_cluster as C
from tools.launch import checkpoints
from tools.recipes.recipe import REPO

pytestmark = [
    pytest.mark.slow,
    pytest.mark.upstream,
    pytest.mark.megatron,
    pytest.mark.skipif(
        STACK != "current",
        reason="run on the current stack (verl 0.6 of published merges ray_init.runtime_env alike; not run here)",
    ),
]


def _node(cluster: dict, temp: str, cpus: int, flags: int, *head: str) -> subprocess.CompletedProcess:
    """`make ray-head` (with `head`: its port and dashboard) or `make ray-worker` for tiny-cpu on this
    machine, with `cpus` CPU slots for the run's work."""
    role = ["head", *head, "--no-wait"] if head else ["worker", "--address", f"127.0.0.1:{cluster['port']}"]
    res = _cli(*role, "--recipe", "tiny-cpu", "--temp-dir", temp, "--num-cpus", str(cpus), *_node_flags(flags),
               env=cluster["env"])  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    return res


# transfer_queue places its storage unit (1 CPU) on the first alive node by id: here that may be the head, which
# has no CPU for work, so it is asked for a node with CPUs (its own key; on a real cluster every node has them)
ON_WORKER_NODE = (
    "+launch.verl_add.transfer_queue=the_test_head_has_no_CPU",
    "+verl.transfer_queue.backend.SimpleStorage.required_node_resource=CPU",
)


class RayJob:
    """`make ray-job RECIPE=tiny-cpu HEAD=...` with its run folders under `outputs`, its output read as it
    comes."""

    def __init__(self, cluster: dict, outputs: Path, *args: str) -> None:
        env = {**os.environ, "ASCEND_R1_OUTPUTS": str(outputs), "ASCEND_R1_STACK": STACK}
        head = f"127.0.0.1:{cluster['port']}"
        self.folder = outputs / STACK / "tiny-cpu"
        self.proc = subprocess.Popen(
            ["make", "--no-print-directory", "ray-job", "RECIPE=tiny-cpu", f"HEAD={head}",
             f"ARGS=launch.ray.dashboard_port={cluster['dash']} launch.restarts=1 {' '.join([*ON_WORKER_NODE, *args])}"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, ready, what: str, timeout: float) -> float:
        deadline = time.time() + timeout
        while not ready():
            assert self.proc.poll() is None, f"make ray-job ended before {what}:\n" + self.text()[-4000:]
            assert time.time() < deadline, f"no {what} within {timeout} s:\n" + self.text()[-4000:]
            time.sleep(0.5)
        return time.time()

    def said(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def finish(self, timeout: float) -> tuple[int, float]:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            stop_run(self.proc)
            pytest.fail(f"make ray-job did not end within {timeout} s:\n" + self.text()[-4000:])
        ended = time.time()
        time.sleep(1.0)  # the reader thread has the last lines
        return rc, ended


@outside_ci(
    "about 8 min: two make ray-job runs on real raylets; tests/tools/cluster/test_node_wait.py runs the same"
    " wait, restart and exit 3 against a fake verl and node list in CI"
)
def test_a_raylet_killed_mid_run_back_restarts_the_run_and_never_back_ends_it_with_exit_3(ray_env, tmp_path):  # noqa: F811
    head_temp, node_temp, _ = ray_env["temps"]
    t0 = time.time()
    _node(
        ray_env, head_temp, 0, 27000, "--port", str(ray_env["port"]), "--dashboard-port", str(ray_env["dash"])
    )
    _node(ray_env, node_temp, 8, 28000)
    # a checkpoint every step, so that the restart has one to start from
    job = RayJob(ray_env, tmp_path / "outputs", "verl.trainer.save_freq=1", "verl.trainer.val_before_train=false",
                 "launch.ray.node_wait_s=240")  # fmt: skip
    ckpt = job.folder / "checkpoints"
    job.wait_for(lambda: (checkpoints.tracked_step(ckpt) or 0) >= 1, "the checkpoint of step 1", 900)
    assert C.stop(node_temp, grace=0, quiet=True) > 0  # the node, lost: its raylet and every worker on it
    killed = time.time()
    job.wait_for(lambda: job.said("waiting: 0 of 1 nodes with 1 CPU"), "the wait for the lost node", 300)
    lost_for = time.time() - killed
    _node(ray_env, node_temp, 8, 29000)  # back (a new raylet: Ray gives it a new node id)
    rc, ended = job.finish(900)
    out = job.text()
    assert rc == 0, out[-4000:]
    assert "make ray-job: verl's driver attaches to the Ray cluster at 127.0.0.1:" in out
    assert re.search(r"node lost at step \d: restarting \(1 of launch.restarts 1\)", out), out[-4000:]
    assert "cluster ready: 1 nodes x 1 CPU" in out
    rows = metrics(job.folder)
    (r,) = [r for r in rows if r["kind"] == "restart"]
    assert r["cause"] == "node lost" and re.fullmatch(r"node \S+ \(Ray node [0-9a-f]{12}\)", r["process"]), r
    assert r["resumed_from"] >= 1 and r["to_first_step_s"] is not None, r
    assert [x["step"] for x in rows if x["kind"] == "train"] == [1, 2, 3]
    print(
        f"\nkilled the raylet {killed - t0:.0f} s into the test; the supervisor waited for it {lost_for:.0f} s"
        f" after the kill; resumed from step {r['resumed_from']}; the first step again {r['to_first_step_s']} s"
        f" after the stop (the node's return included); finished {ended - killed:.0f} s after the kill"
    )

    # never back: after launch.ray.node_wait_s, exit 3 naming the node
    t1 = time.time()
    job = RayJob(ray_env, tmp_path / "outputs", "launch.steps=1", "launch.ray.node_wait_s=20")
    job.wait_for(lambda: job.said("the actor and reference workers are up"), "the workers", 600)
    assert C.stop(node_temp, grace=0, quiet=True) > 0
    killed = time.time()
    rc, ended = job.finish(600)
    out = job.text()
    # the supervisor exits 3; make says so (`Error 3`) and exits 2 itself, as for any failed command
    assert rc == 2 and re.search(r"make(\[\d+\])?: \*\*\* \[Makefile:\d+: ray-job\] Error 3", out), out[
        -4000:
    ]
    assert re.search(r"no restart: node \S+ \(Ray node [0-9a-f]{12}\) lost", out) and (
        "lost, and neither it nor a replacement with 1 CPU joined within 20 s (launch.ray.node_wait_s)" in out
    ), out[-4000:]
    assert "error: the run failed: node lost at step 4" in out
    print(f"never back: exit 3 {ended - killed:.0f} s after the kill ({ended - t1:.0f} s for the second run)")
    print(f"the whole test: {time.time() - t0:.0f} s")
