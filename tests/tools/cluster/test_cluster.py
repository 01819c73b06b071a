"""Ray cluster start/stop (tools/cluster/ray_cluster.py), the shell entry points and the Slurm/KubeRay templates.

The Ray tests start real raylets on this machine, each cluster in its own temp dir with its own ports, and
stop them by temp dir only, so other Ray clusters on the machine are never touched."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import psutil
import pytest
import yaml

from tests.conftest import STACK
from tools.cluster import ray_cluster as C
from tools.cluster import templates
from tools.launch.__main__ import delegate
from tools.recipes.recipe import REPO, compose

SCRIPTS = REPO / "tools" / "cluster" / "scripts"
PY = sys.executable


# ---- node address, waiting, messages (no Ray) ----


def test_node_address_from_the_named_interface_never_a_probe():
    assert C.node_address({"HCCL_SOCKET_IFNAME": "lo"}) == ("127.0.0.1", "HCCL_SOCKET_IFNAME=lo")
    assert C.node_address({"GLOO_SOCKET_IFNAME": "lo,eth9"})[0] == "127.0.0.1"  # gloo takes a list
    assert C.node_address({"HCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "nope"})[0] == "127.0.0.1"
    assert C.node_address({}) == (None, "Ray's own choice (no HCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME set)")
    with pytest.raises(C.ClusterError, match="interface 'nope0' does not exist.*\n  fix: .*one of: .*lo"):
        C.node_address({"HCCL_SOCKET_IFNAME": "nope0"})


def test_wait_names_the_missing_and_the_short_nodes():
    calls = []

    def lister(address, resource):
        calls.append(time.monotonic())
        return [C.Node("10.0.0.1", True, 16), C.Node("10.0.0.2", True, 8), C.Node("10.0.0.3", False, 16)]

    with pytest.raises(C.ClusterError) as e:
        C.wait_for(
            "10.0.0.1:6766",
            3,
            16,
            "NPU",
            timeout=0.3,
            expect=["10.0.0.1", "10.0.0.2", "10.0.0.4"],
            poll=0.1,
            lister=lister,
        )
    msg = str(e.value)
    assert "1 of 3 nodes joined with 16 NPU each" in msg
    assert "short of devices: 10.0.0.2 (8 NPU)" in msg and "missing: 10.0.0.4" in msg
    assert "make ray-worker" in msg and len(calls) >= 2  # it polled until the timeout

    joined = []

    def late(address, resource):  # the second node joins on the third poll
        joined.append(1)
        return [C.Node("a", True, 2)] + ([C.Node("b", True, 2)] if len(joined) >= 3 else [])

    assert len(C.wait_for("a:1", 2, 2, "NPU", timeout=10, poll=0.05, lister=late)) == 2


def test_shell_entry_points_pass_shellcheck():
    sc = shutil.which("shellcheck")
    if not sc:
        pytest.skip("shellcheck is not installed (Debian: apt-get install -y shellcheck)")
    scripts = sorted(SCRIPTS.glob("ray-*.sh"))
    assert len(scripts) == 3
    subprocess.run(
        [sc, "-x", *map(str, scripts), str(SCRIPTS / "checkout.sh")], check=True
    )  # what they source
    for s in scripts:
        assert os.access(s, os.X_OK), s
    res = subprocess.run([str(SCRIPTS / "ray-worker.sh"), "tiny-cpu"], capture_output=True, text=True)
    assert res.returncode == 2 and "usage:" in res.stderr


def test_slurm_template_from_the_recipe(tmp_path):
    cfg = compose("deepseek-v3-671b-a3", ["launch.nodes=4"])
    text = templates.slurm(cfg)
    assert "#SBATCH --nodes=4" in text and "--ntasks-per-node=1" in text
    assert "ray-head.sh deepseek-v3-671b-a3 --set launch.nodes=4 --no-wait" in text
    assert "--hold --rejoin" in text and "--kill-on-bad-exit=0" in text and "#SBATCH --no-kill" in text
    # the run under make ray-job's supervisor (not verl's command bare): the watchdog, the restarts
    assert "-m tools.launch cluster job --recipe deepseek-v3-671b-a3 --set launch.nodes=4" in text
    assert "main_ppo" not in text and "--direct" not in text
    sc = shutil.which("shellcheck")
    if sc:
        f = tmp_path / "job.sbatch"
        f.write_text(text)
        subprocess.run([sc, str(f)], check=True)


def test_kuberay_template_from_the_recipe():
    cfg = compose("deepseek-v3-671b-a3")
    doc = yaml.safe_load(templates.kuberay(cfg))
    assert doc["kind"] == "RayJob" and doc["apiVersion"] == "ray.io/v1"
    spec = doc["spec"]["rayClusterSpec"]
    assert spec["workerGroupSpecs"][0]["replicas"] == 15
    head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["resources"]["limits"]["huawei.com/Ascend910"] == 16
    # the published stack's rollout reads its DP size from the environment; current's verl passes it to vLLM
    assert ({"name": "VLLM_DP_SIZE", "value": "128"} in head["env"]) == (STACK == "published")
    assert json.loads(json.loads(spec["headGroupSpec"]["rayStartParams"]["resources"])) == {"NPU": 16}
    entry = doc["spec"]["entrypoint"]
    # make ray-job's supervisor on the head pod, attached to the cluster Ray set up for the job (RAY_ADDRESS)
    assert entry == (
        "cd /workspace/ascend-r1 && python -m tools.launch cluster job --recipe deepseek-v3-671b-a3"
        " --dashboard-port=8265"
    )
    # the run folders, checkpoints included, on the claim every pod mounts
    outputs = next(e["value"] for e in head["env"] if e["name"] == "ASCEND_R1_OUTPUTS")
    assert (
        outputs.endswith("/outputs") and head["volumeMounts"][0]["mountPath"] == outputs[: -len("/outputs")]
    )
    assert {"name": "VERL_FILE_LOGGER_ROOT", "value": "/workspace/ascend-r1/outputs"} in head["env"]
    assert str(REPO) not in doc["spec"]["runtimeEnvYAML"]
    cpu = yaml.safe_load(templates.kuberay(compose("tiny-cpu")))
    assert cpu["spec"]["rayClusterSpec"]["workerGroupSpecs"] == []


# ---- real Ray on this machine ----


def _ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _node_flags(worker_range: int) -> list[str]:
    a, g, m, r, n, o = _ports(6)
    return [
        f"--ray-arg=--dashboard-agent-listen-port={a}",
        f"--ray-arg=--dashboard-agent-grpc-port={g}",
        f"--ray-arg=--metrics-export-port={m}",
        f"--ray-arg=--runtime-env-agent-port={r}",
        f"--ray-arg=--node-manager-port={n}",
        f"--ray-arg=--object-manager-port={o}",
        f"--ray-arg=--min-worker-port={worker_range}",
        f"--ray-arg=--max-worker-port={worker_range + 499}",
    ]


def _ours(temp: str) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if temp + "/" in cmd:
            out.append(p.info["pid"])
    return out


@pytest.fixture
def ray_env(monkeypatch):
    monkeypatch.setenv("HCCL_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    tag = f"{os.getpid() % 100000}-{int(time.time()) % 100000}"
    temps = [f"/tmp/r1t-{tag}-{i}" for i in range(3)]
    port, dash = _ports(2)
    yield {"temps": temps, "port": port, "dash": dash, "env": {**os.environ, "PYTHONPATH": str(REPO)}}
    for t in temps:  # stop whatever a failed test left, ours only
        C.stop(t, grace=5, quiet=True)
        shutil.rmtree(t, ignore_errors=True)


def _cli(*args: str, env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "tools.launch", "cluster", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_single_node_ray_head_job_submit_direct_and_clean_stop(ray_env):
    head_temp = ray_env["temps"][0]
    env = ray_env["env"]
    res = _cli(
        "head",
        "--temp-dir",
        head_temp,
        "--port",
        str(ray_env["port"]),
        "--dashboard-port",
        str(ray_env["dash"]),
        "--devices",
        "2",
        "--resource",
        "NPU",
        "--num-cpus",
        "1",
        "--nodes",
        "1",
        "--wait-timeout",
        "60",
        *_node_flags(23000),
        env=env,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "node address 127.0.0.1 from HCCL_SOCKET_IFNAME=lo" in res.stdout
    assert "cluster ready: 1 nodes x 2 NPU" in res.stdout
    address = f"127.0.0.1:{ray_env['port']}"
    probe = (
        "import os, ray; ray.init(); "
        "print('RESULT', ray.cluster_resources().get('NPU'), os.environ.get('HCCL_BUFFSIZE'))"
    )
    # through the job server, with the recipe-style env reaching the job
    job = subprocess.run(
        [
            C.ray_exe(),
            "job",
            "submit",
            f"--address=http://127.0.0.1:{ray_env['dash']}",
            f"--runtime-env-json={json.dumps({'env_vars': {'HCCL_BUFFSIZE': '300'}})}",
            "--",
            PY,
            "-c",
            probe,
        ],
        env=C.ray_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert "RESULT 2.0 300" in job.stdout, job.stdout + job.stderr
    # directly, as a driver on the head (what `cluster job --direct` does)
    direct = subprocess.run(
        [PY, "-c", probe],
        env={**C.ray_env(), "RAY_ADDRESS": address},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "RESULT 2.0 None" in direct.stdout, direct.stdout + direct.stderr
    assert _ours(head_temp)
    stop = _cli("stop", "--temp-dir", head_temp, env=env)
    assert stop.returncode == 0 and "none left" in stop.stdout, stop.stdout + stop.stderr
    assert _ours(head_temp) == []


@pytest.mark.slow
def test_two_raylets_one_joining_late_one_never(ray_env):
    head_temp, w1_temp, w2_temp = ray_env["temps"]
    env, port, dash = ray_env["env"], ray_env["port"], ray_env["dash"]
    address = f"127.0.0.1:{port}"
    head = subprocess.Popen(
        [
            PY,
            "-m",
            "tools.launch",
            "cluster",
            "head",
            "--temp-dir",
            head_temp,
            "--port",
            str(port),
            "--dashboard-port",
            str(dash),
            "--devices",
            "2",
            "--resource",
            "NPU",
            "--num-cpus",
            "1",
            "--nodes",
            "2",
            "--wait-timeout",
            "150",
            *_node_flags(24000),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # the worker joins late: once the head says it waits for it (the head gives up after its
        # --wait-timeout, which ends this read too)
        before = []
        for line in head.stdout:
            before.append(line)
            if line.startswith("waiting: 1 of 2 nodes with 2 NPU"):
                break
        assert head.poll() is None, "".join(before) + head.stdout.read()
        worker = _cli(
            "worker",
            "--address",
            address,
            "--temp-dir",
            w1_temp,
            "--devices",
            "2",
            "--resource",
            "NPU",
            "--num-cpus",
            "1",
            "--retries",
            "3",
            "--delay",
            "2",
            *_node_flags(25000),
            env=env,
        )
        assert worker.returncode == 0 and "worker joined" in worker.stdout, worker.stdout + worker.stderr
        out = "".join(before) + head.communicate(timeout=150)[0]
        assert head.returncode == 0, out
        assert "cluster ready: 2 nodes x 2 NPU" in out
    finally:
        if head.poll() is None:
            head.kill()
    # a third node never joins: the wait ends at its timeout and names who is missing
    env3 = {**env, "ASCEND_R1_RAY_DASHBOARD_PORT": str(dash)}
    waited = _cli(
        "wait",
        "--address",
        address,
        "--dashboard-port",
        str(dash),
        "--nodes",
        "3",
        "--devices",
        "2",
        "--resource",
        "NPU",
        "--timeout",
        "6",
        "--expect",
        "node-never",
        env=env3,
    )
    assert waited.returncode == 2, waited.stdout + waited.stderr
    assert "2 of 3 nodes joined with 2 NPU each" in waited.stderr and "missing: node-never" in waited.stderr
    # bounded retries: a worker for a head that is not there gives up after its attempts
    (dead,) = _ports(1)
    t0 = time.monotonic()
    lost = _cli(
        "worker",
        "--address",
        f"127.0.0.1:{dead}",
        "--temp-dir",
        w2_temp,
        "--devices",
        "2",
        "--resource",
        "NPU",
        "--num-cpus",
        "1",
        "--retries",
        "2",
        "--delay",
        "1",
        "--attempt-timeout",
        "15",
        *_node_flags(26000),
        env=env,
    )
    assert lost.returncode == 2 and "after 2 attempts" in lost.stderr, lost.stdout + lost.stderr
    assert "attempt 1/2" in lost.stdout and time.monotonic() - t0 < 120
    # clean stop: nothing of these clusters is left
    for t in (head_temp, w1_temp, w2_temp):
        assert _cli("stop", "--temp-dir", t, env=env).returncode == 0
        assert _ours(t) == [], t


def test_job_runs_make_trains_supervisor_attached_to_the_cluster(monkeypatch):
    """`cluster job` (make ray-job): make train's supervisor with the cluster's address; --submit: that same
    command as a Ray job's entrypoint (ray job submit)."""
    from tools.launch import train

    seen = []
    monkeypatch.setattr(train, "train", lambda a: seen.append(a) or 0)
    argv = [
        "job",
        "--recipe",
        "deepseek-v3-671b-a3",
        "--address",
        "10.0.0.1:6766",
        "--set",
        "launch.restarts=2",
    ]
    assert delegate("cluster", [*argv, "verl.trainer.total_epochs=2", "--run=big"]) == 0
    (a,) = seen
    assert (a.cluster, a.recipe, a.run) == ("10.0.0.1:6766", "deepseek-v3-671b-a3", "big")
    assert a.overrides == ["launch.restarts=2", "verl.trainer.total_epochs=2"]
    calls = []
    monkeypatch.setattr(subprocess, "call", lambda cmd, **kw: calls.append((cmd, kw)) or 0)
    assert delegate("cluster", [*argv, "--submit", "--no-wait"]) == 0 and len(seen) == 1
    cmd, kw = calls[-1]
    assert cmd[1:5] == [
        "job",
        "submit",
        "--address=http://10.0.0.1:8260",
        "--no-wait",
    ]  # the recipe's dashboard
    entry = cmd[cmd.index("--") + 1 :]
    assert entry[:2] == ["bash", "-c"] and entry[2].startswith(f"cd {REPO} && ")
    assert (
        "-m tools.launch cluster job --recipe deepseek-v3-671b-a3 --address 10.0.0.1:6766 --dashboard-port=8260"
        " launch.restarts=2" in entry[2]
    )
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(C.ClusterError, match="no cluster address"):
        delegate("cluster", ["job", "--recipe", "tiny-cpu"])
