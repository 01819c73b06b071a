"""verl patch `verl-vllm-rollout-data-parallel-groups...` (docs/design.md §2 and §2b).

- the rank arithmetic against the definition vLLM itself uses (``arange(W).reshape(-1, D, 1, T)``,
  then the transposes of ``initialize_model_parallel``) for many (world, TP, DP);
- each bad layout fails with one message naming the variable, the value found, the value expected
  and why;
- a multi-process gloo run, world 8, TP 2, DP 4 (forked from a child process whose import path starts
  with the trees under test): every rank computes its VLLM_DP_* variables, puts them in os.environ and
  vllm.envs, builds the groups with torch.distributed from the computed layout and all-reduces inside
  each; then vLLM's own init_distributed_environment / initialize_model_parallel build vLLM's groups,
  which must equal ours; then the v1 engine's stateless DP group (ParallelConfig from the
  environment, stateless_init_dp_group) must form the same DP groups with TP 2 (docs/design.md §2b: with
  one port for all, two processes claim each DP rank).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.published.patches.trees import import_from_tree, vllm_metadata_dir

pytestmark = pytest.mark.upstream

RESULT_PREFIX = "RESULT "


@pytest.fixture(scope="module")
def dpg():
    return import_from_tree("verl", "verl.workers.rollout.npu.dp_groups")


def _reference(world: int, tp: int, dp: int) -> dict[str, list[tuple[int, ...]]]:
    """vLLM 0.9.1's initialize_model_parallel, PP 1 (parallel_state.py)."""
    all_ranks = torch.arange(world).reshape(-1, dp, 1, tp)
    tp_groups = [tuple(x.tolist()) for x in all_ranks.view(-1, tp).unbind(0)]
    dp_groups = [tuple(x.tolist()) for x in all_ranks.transpose(1, 3).reshape(-1, dp).unbind(0)]
    ep_groups = [tuple(x.tolist()) for x in all_ranks.transpose(1, 2).reshape(-1, dp * tp).unbind(0)]
    return {"tp": sorted(tp_groups), "dp": sorted(dp_groups), "ep": sorted(ep_groups)}


LAYOUTS = [
    (w, t, d)
    for w in (1, 2, 4, 6, 8, 12, 16, 32, 64, 256)
    for t in (1, 2, 4, 8)
    for d in range(1, w + 1)
    if w % (t * d) == 0
]


def test_rank_arithmetic_matches_the_reshape_definition(dpg):
    assert len(LAYOUTS) > 100
    for w, t, d in LAYOUTS:
        ref = _reference(w, t, d)
        assert dpg.all_groups(w, t, d) == ref, (w, t, d)
        for r in range(w):
            lay = dpg.rank_layout(r, w, t, d)
            assert r in lay.tp_group and r in lay.dp_group and r in lay.ep_group
            assert lay.dp_group.index(r) == lay.dp_rank == (r // t) % d
            assert lay.dp_master_rank == lay.dp_group[0]


def test_recipe_layout_256_ranks(dpg):
    groups = dpg.all_groups(256, 2, 128)
    assert groups["dp"] == [tuple(range(0, 256, 2)), tuple(range(1, 256, 2))]
    assert groups["ep"] == [tuple(range(256))]
    ports = dpg.dp_master_ports(256, 2, 128, base_port=29510)
    assert ports == [29510, 29520]


def test_plan_env_per_rank(dpg):
    addresses = [f"10.0.0.{r // 4}" for r in range(8)]  # 2 nodes of 4
    envs = [dpg.plan_env(r, 8, 2, 4, addresses, master_port=29500) for r in range(8)]
    assert [e["VLLM_DP_RANK"] for e in envs] == ["0", "0", "1", "1", "2", "2", "3", "3"]
    assert {e["VLLM_DP_SIZE"] for e in envs} == {"4"}
    assert [e["VLLM_DP_MASTER_IP"] for e in envs] == ["10.0.0.0"] * 8  # ranks 0 and 1 are on node 0
    assert [e["VLLM_DP_MASTER_PORT"] for e in envs] == ["29510", "29520"] * 4
    # world 16, TP 2, DP 4: 2 EP blocks x 2 TP positions = 4 DP groups, masters 0, 1, 8, 9
    addresses = [f"10.0.0.{r // 8}" for r in range(16)]
    envs = [dpg.plan_env(r, 16, 2, 4, addresses, master_port=29500) for r in range(16)]
    assert envs[9]["VLLM_DP_MASTER_IP"] == "10.0.0.1" and envs[15]["VLLM_DP_MASTER_IP"] == "10.0.0.1"
    assert len({e["VLLM_DP_MASTER_PORT"] for e in envs}) == 4


GOOD = {"VLLM_DP_SIZE": "128", "VLLM_VERSION": "0.9.1"}


@pytest.mark.parametrize(
    ("env", "tp", "experts", "variable", "found", "expected"),
    [
        ({**GOOD, "VLLM_DP_SIZE": "64"}, 2, 256, "VLLM_DP_SIZE", "64", "128 (world size 256 / rollout TP 2)"),
        ({"VLLM_VERSION": "0.9.1"}, 2, 256, "VLLM_DP_SIZE", None, "128"),
        (GOOD, 2, 100, "VLLM_DP_SIZE", 128, "dividing the model's 100 routed experts"),
        ({"VLLM_DP_SIZE": "128"}, 2, 256, "VLLM_VERSION", None, "'0.9.1'"),
        ({**GOOD, "VLLM_VERSION": "0.9.2.dev1"}, 2, 256, "VLLM_VERSION", "0.9.2.dev1", "'0.9.1'"),
        ({**GOOD, "VLLM_DP_MASTER_PORT": "29600"}, 2, 256, "VLLM_DP_MASTER_PORT", "29600", "unset"),
        (GOOD, 3, 256, "actor_rollout_ref.rollout.tensor_model_parallel_size", 3, "a divisor"),
    ],
)
def test_bad_layouts_name_variable_value_expected_and_why(dpg, env, tp, experts, variable, found, expected):
    with pytest.raises(dpg.DPLayoutError) as info:
        dpg.validate(env, 256, tp, experts)
    err = info.value
    assert err.variable == variable and err.found == found
    assert expected in err.expected and err.why
    assert str(err).startswith(f"{variable}={found!r}: expected ")


def test_good_layout_passes(dpg):
    assert dpg.validate(GOOD, 256, 2, 256) == 128
    assert dpg.validate({**GOOD, "VLLM_DP_SIZE": "4"}, 8, 2, None) == 4


def test_port_collisions(dpg):
    with pytest.raises(dpg.DPLayoutError, match="collide with torch.distributed's master port"):
        dpg.plan_env(0, 8, 2, 4, ["a"] * 8, master_port=29500, base_port=29495)
    with pytest.raises(dpg.DPLayoutError, match="below 65536"):
        dpg.plan_env(0, 8, 2, 4, ["a"] * 8, master_port=29500, base_port=65530)
    with pytest.raises(dpg.DPLayoutError, match="would share ports"):
        dpg.check_ports([30000, 30005], master_port=29500)


def test_node_address_from_named_interface_and_errors(dpg, monkeypatch):
    assert dpg.node_address({"GLOO_SOCKET_IFNAME": "lo"}) == "127.0.0.1"
    assert dpg.node_address({"HCCL_SOCKET_IFNAME": "=lo"}) == "127.0.0.1"
    with pytest.raises(dpg.DPLayoutError) as info:
        dpg.node_address({"HCCL_SOCKET_IFNAME": "no-such-if0"})
    assert info.value.variable == "HCCL_SOCKET_IFNAME" and info.value.found == "no-such-if0"
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(dpg.DPLayoutError) as info:
        dpg.node_address({})
    assert info.value.variable == "HCCL_SOCKET_IFNAME" and info.value.found is None
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.1.2.3")
    assert dpg.node_address({}) == "10.1.2.3"


def test_gate(dpg):
    assert dpg.enabled(True, {"VLLM_DP_SIZE": "4"})
    assert not dpg.enabled(False, {"VLLM_DP_SIZE": "4"})  # CUDA / CPU: upstream behaviour
    assert not dpg.enabled(True, {})  # NPU without the recipe's explicit setting


# ---------------------------------------------------------------- the gloo run (child process)

CHILD = r"""
import json, os, socket, sys, traceback
import multiprocessing as mp
import torch, torch.distributed as dist

WORLD, TP, DP = 8, 2, 4
os.environ.update(GLOO_SOCKET_IFNAME="lo", VLLM_HOST_IP="127.0.0.1", VLLM_LOGGING_LEVEL="WARNING")
import vllm, vllm.envs
from vllm.config import ParallelConfig
from vllm.distributed import parallel_state as ps
from verl.workers.rollout.npu import dp_groups as dpg

def free_port():
    # below the ephemeral range: the DP master ports are derived from this one (+ 10 a DP group), and the
    # ranks' own gloo connections take ephemeral ports, so a derived port there could already be taken
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    rng = __import__("random").Random(os.getpid())
    for _ in range(200):
        port = rng.randrange(20000, low - 64)
        try:
            for p in range(port, port + 64):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
    raise RuntimeError("no 64 free ports below the ephemeral range")

def rank_main(rank, port, queue):
    out = {}
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank))
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
        env = {**os.environ, "VLLM_DP_SIZE": str(DP), "VLLM_VERSION": "0.9.1"}
        dp = dpg.validate(env, WORLD, TP, num_experts=16)
        addresses = dpg.gather_addresses(dpg.node_address(env))
        planned = dpg.plan_env(rank, WORLD, TP, dp, addresses, master_port=port)
        dpg.apply_env(planned)
        out["env"] = {k: os.environ[k] for k in planned}
        out["vllm_envs"] = {k: getattr(vllm.envs, k) for k in planned}
        lay = dpg.rank_layout(rank, WORLD, TP, dp)
        # 1. groups built with torch.distributed from the computed layout; all-reduce of (rank + 1)
        sums = {}
        for kind, groups in dpg.all_groups(WORLD, TP, dp).items():
            for ranks in groups:
                g = dist.new_group(list(ranks))
                if rank in ranks:
                    t = torch.tensor([rank + 1.0]); dist.all_reduce(t, group=g); sums[kind] = t.item()
        out["ours"] = sums
        # 2. vLLM's own group construction, from the patched tree, on gloo
        dpg.init_vllm_groups(TP, backend="gloo", device="cpu")
        vl = {"tp": ps.get_tp_group(), "dp": ps.get_dp_group(), "ep": ps.get_ep_group()}
        out["vllm_ranks"] = {k: list(g.ranks) for k, g in vl.items()}
        vsums = {}
        for k, g in vl.items():
            t = torch.tensor([rank + 1.0]); dist.all_reduce(t, group=g.device_group); vsums[k] = t.item()
        out["vllm_sums"] = vsums
        out["layout"] = {"tp": list(lay.tp_group), "dp": list(lay.dp_group), "ep": list(lay.ep_group)}
        # 3. the v1 engine's stateless DP group, configured from the environment as LLMEngine does
        pc = ParallelConfig(tensor_parallel_size=TP, distributed_executor_backend="external_launcher")
        assert pc.data_parallel_size == DP, pc.data_parallel_size
        sg = pc.stateless_init_dp_group()
        t = torch.tensor([rank + 1.0]); torch.distributed.all_reduce(t, group=sg)
        out["stateless_dp_sum"] = t.item()
        out["has_unfinished"] = ParallelConfig.has_unfinished_dp(sg, rank == lay.dp_group[-1])
        dist.barrier()
    except Exception:
        out["error"] = traceback.format_exc()
    queue.put((rank, out))

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, port, q), daemon=True) for r in range(WORLD)]
    for p in procs: p.start()
    results = {}
    import queue, time
    deadline = time.monotonic() + 120  # a wrong rendezvous hangs: report it instead of waiting
    while len(results) < WORLD and time.monotonic() < deadline:
        try:
            r, o = q.get(timeout=max(1.0, deadline - time.monotonic())); results[r] = o
        except queue.Empty:
            break
    for r in range(WORLD):
        results.setdefault(r, {"error": "no result within 120 s (a group rendezvous hung)"})
    print("RESULT " + json.dumps({"port": port, "ranks": results}), flush=True)
    for p in procs:  # ranks stuck in a rendezvous would keep the output pipe open
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
"""


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory):
    from tests.conftest import upstream_tree

    verl_tree, vllm_tree = upstream_tree("verl"), upstream_tree("vllm")
    meta = vllm_metadata_dir(tmp_path_factory.mktemp("meta"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(verl_tree), str(vllm_tree), str(meta)])}
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"the gloo run failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    data = json.loads(lines[-1][len(RESULT_PREFIX) :])
    errors = {r: o["error"] for r, o in data["ranks"].items() if "error" in o}
    if errors:
        pytest.fail(
            "ranks failed:\n" + "\n".join(f"rank {r}:\n{e}" for r, e in errors.items()), pytrace=False
        )
    data["trees"] = (Path(verl_tree), Path(vllm_tree))
    return data


WORLD, TP, DP = 8, 2, 4


def _sum(ranks) -> float:
    return float(sum(r + 1 for r in ranks))


@pytest.mark.slow  # about 20-40 s on 2 cores: importing vLLM once, then 8 forked gloo ranks
def test_gloo_groups_from_the_computed_environment(gloo_run):
    ranks = gloo_run["ranks"]
    port = gloo_run["port"]
    for r in range(WORLD):
        out = ranks[str(r)]
        assert out["env"]["VLLM_DP_RANK"] == str((r // TP) % DP)
        assert out["env"]["VLLM_DP_MASTER_IP"] == "127.0.0.1"
        # one port per DP group (index r % TP here), above MASTER_PORT, vLLM's 10 reserved ports apart
        assert out["env"]["VLLM_DP_MASTER_PORT"] == str(port + 10 + 10 * (r % TP))
        assert out["vllm_envs"] == {
            "VLLM_DP_SIZE": DP,
            "VLLM_DP_RANK": (r // TP) % DP,
            "VLLM_DP_MASTER_IP": "127.0.0.1",
            "VLLM_DP_MASTER_PORT": int(out["env"]["VLLM_DP_MASTER_PORT"]),
        }
        tp = [r - r % TP, r - r % TP + 1]
        dp = [r % TP + TP * d for d in range(DP)]
        assert out["layout"] == {"tp": tp, "dp": dp, "ep": list(range(WORLD))}
        assert out["ours"] == {"tp": _sum(tp), "dp": _sum(dp), "ep": _sum(range(WORLD))}


@pytest.mark.slow
def test_vllm_builds_the_same_groups(gloo_run):
    for r in range(WORLD):
        out = gloo_run["ranks"][str(r)]
        assert out["vllm_ranks"] == out["layout"], f"rank {r}: vLLM's groups differ from ours"
        assert out["vllm_sums"] == out["ours"]
        # unpatched verl sets no VLLM_DP_* variables: vLLM then builds DP groups of one rank and EP = the TP pair
        assert len(out["vllm_ranks"]["dp"]) == DP and len(out["vllm_ranks"]["ep"]) == WORLD


@pytest.mark.slow
def test_v1_engine_stateless_dp_group_with_tp2(gloo_run):
    for r in range(WORLD):
        out = gloo_run["ranks"][str(r)]
        assert out["stateless_dp_sum"] == _sum(out["layout"]["dp"]), f"rank {r}: wrong stateless DP group"
        assert out["has_unfinished"] is True  # OR over the group: its last member has work
