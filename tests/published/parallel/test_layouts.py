"""The flagship's parallel layout in miniature: verl's Megatron actor gives the same numbers at
every parallel layout as on one rank, and a checkpoint saved at one layout resumes at another.

verl's own Megatron worker (`ActorRolloutRefWorker`, role actor) runs on gloo ranks forked by
tests/published/parallel/layout_child.py, in fp32, on the recipe tiny-cpu-parallel's model (a tiny DeepSeek-V3:
MLA, 4 layers with the first dense, 8 routed experts, the all-to-all token dispatcher), at

    single    1 rank                                   the reference
    pp2ep2    4 ranks: PP2 x EP2 (DP2, expert-DP 1)   the recipe's layout (the 671B run: PP8 x EP32)
    tp2sp     2 ranks: TP2 + SP, EP2, ETP1              what Megatron requires for TP with MoE

Each layout computes the log-probs of one fixed batch (every data-parallel rank its share, as verl
dispatches it), takes two update steps (GRPO loss with the KL term, the distributed optimizer, gradient
clipping, MoE expert-bias updates), and computes the log-probs after each. pp2ep2 saves a checkpoint
after its first step; tp2sp loads it after its own steps (another TP, PP, DP and sequence split) and
repeats pp2ep2's second step from it. Each layout also computes the log-probs once with two experts of
expert rank 1 swapped (what a hand-over placing a shard at the wrong index does): the tolerance must
catch that.

Measured (2026-11-23, 2 cores): log-probs equal to 5e-7, gradient norms to 3e-7 (relative), log-probs
after two steps to 1e-5; about 2-4 minutes for the three layouts (imports once, ~25 s of CPU).
Without the patches (patches/megatron, patches/verl) the multi-rank layouts do not run at all on CPU
(CUDA calls in the collectives and pipeline exchange, the all-to-all dispatcher's CUDA stream, the torch
norm refusing sequence parallelism), the TP2 update is wrong (the MLA rotary key's gradient from one
rank's heads only: gradient norm 2.2e-5 off, log-probs after one step 0.05 off) and the resume fails
("Missing key in checkpoint state_dict: rng_state/shard_...").
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import upstream_tree

pytestmark = [pytest.mark.slow, pytest.mark.upstream, pytest.mark.megatron]
REPO = Path(__file__).resolve().parents[3]
CHILD = Path(__file__).with_name("layout_child.py")
RECIPE = "tiny-cpu-parallel"
MG = "verl.actor_rollout_ref.actor.megatron."
LAYOUTS = {  # name: (world, TP, PP, EP, ETP, SP)
    "single": (1, 1, 1, 1, 1, False),
    "pp2ep2": (4, 1, 2, 2, 1, False),
    "tp2sp": (2, 2, 1, 2, 1, True),
}
LP_ATOL = 2e-6  # fp32 log-probs of the same weights (measured <= 5e-7)
STEP_ATOL = 5e-5  # log-probs after one or two Adam steps (measured <= 1e-5)
NORM_RTOL = 1e-5  # gradient norm and losses (measured <= 3e-7)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def layout_overrides(root: Path, world: int, tp: int, pp: int, ep: int, etp: int, sp: bool) -> list[str]:
    return [
        f"launch.paths.root={root}",
        f"launch.devices_per_node={world}",
        f"{MG}tensor_model_parallel_size={tp}",
        f"{MG}pipeline_model_parallel_size={pp}",
        f"{MG}expert_model_parallel_size={ep}",
        f"{MG}expert_tensor_parallel_size={etp}",
        f"{MG}sequence_parallel={'true' if sp else 'false'}",
        # the layouts' own forward and update, without the rollout's routed experts that the current stack's
        # default routing replay (correction=auto) and its measurement would carry from an engine
        "correction=none",
        "launch.measure_routing=false",
    ]


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    """The recipe's tiny model and its Megatron checkpoint (hf-to-mcore), made in a temporary folder."""
    upstream_tree("verl")
    upstream_tree("megatron")
    from tools.miniature.assets import Assets, make_mcore, make_model
    from tools.recipes.recipe import compose

    root = tmp_path_factory.mktemp("tiny-parallel")
    a = Assets.from_launch(compose(RECIPE, [f"launch.paths.root={root}"]).launch)
    make_model(a, log=lambda m: None)
    make_mcore(a, log=lambda m: None)
    return root


def run_plan(
    root: Path, out: Path, layouts: list[dict], timeout: int = 900, child: Path = CHILD
) -> dict[str, list[dict]]:
    """Run the layouts in turn (`child`: this stack's layout_child.py); returns each layout's rank outputs."""
    specs = []
    for spec in layouts:
        world, tp, pp, ep, etp, sp = LAYOUTS[spec["layout"]]
        specs.append(
            {
                "name": spec["name"],
                "layout": {"tp": tp, "pp": pp, "ep": ep, "etp": etp, "sp": sp},
                "world": world,
                "port": _port(),
                "recipe": RECIPE,
                "overrides": layout_overrides(root, world, tp, pp, ep, etp, sp),
                "out": str(out / spec["name"]),
                "save": str(out / spec["save"]) if spec.get("save") else None,
                "load": str(out / spec["load"]) if spec.get("load") else None,
            }
        )
    plan = out / "plan.json"
    plan.write_text(json.dumps({"layouts": specs, "report": str(out / "report.json"), "timeout": 400}))
    r = subprocess.run(
        [sys.executable, str(child), str(plan)], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    left = processes_of(plan)
    for _ in range(50):  # a process killed just now may take a moment to go
        if not left:
            break
        time.sleep(0.1)
        left = processes_of(plan)
    assert not left, f"the layout run left processes behind: {left}"
    if r.returncode != 0:
        logs = "\n".join(
            f"--- {p}:\n" + "\n".join(p.read_text(errors="replace").splitlines()[-25:])
            for p in sorted(out.glob("*/log*.txt"))
        )
        raise AssertionError(f"layout run failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}\n{logs}")
    return {
        spec["name"]: [torch.load(p) for p in sorted((out / spec["name"]).glob("rank*.pt"))] for spec in specs
    }


def processes_of(plan: Path) -> list[str]:
    """The processes still alive whose command line names `plan` (the child, its ranks, and anything they
    forked: they all carry the child's command line), as 'pid: state'. Zombies (exited, not yet reaped by
    init) do not count."""
    left = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if str(plan) not in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            left.append(f"{proc.name}: {state}")
    return left


# The layouts each test reads; the module runs only those the selected tests need (one child process,
# imports once), so that `pytest ...::test_x[pp2ep2]` (and make verify-patch-tests) stays cheap.
NEEDS = {
    "test_every_rank_holds_its_own_share": {"single", "pp2ep2", "tp2sp"},
    "test_log_probs_equal_the_single_rank_run": {"single"},  # + the parametrized layout
    "test_update_step_gives_the_single_rank_loss_and_gradient_norm": {"single"},
    "test_checkpoint_saved_at_pp2ep2_resumes_at_tp2sp": {"pp2ep2", "tp2sp", "resume"},
}


def needed_layouts(items, module: str = __file__, needs: dict[str, set[str]] = NEEDS) -> set[str]:
    needed: set[str] = set()
    for item in items:
        if Path(str(item.fspath)) != Path(module) or item.originalname not in needs:
            continue
        needed |= needs[item.originalname]
        param = getattr(item, "callspec", None)
        if param is not None and "layout" in param.params:
            needed.add(param.params["layout"])
    return needed


@pytest.fixture(scope="module")
def child() -> Path:
    """What a rank does on this stack (tests/current/parallel/test_layouts.py gives its own)."""
    return CHILD


@pytest.fixture(scope="module")
def runs(request, assets, child, tmp_path_factory) -> dict[str, list[dict]]:
    needed = needed_layouts(request.session.items, request.path) or {"single", "pp2ep2", "tp2sp", "resume"}
    resume = "resume" in needed
    plan = [
        {"name": "single", "layout": "single"},
        {"name": "pp2ep2", "layout": "pp2ep2", "save": "ckpt-pp2ep2" if resume else None},
        {"name": "tp2sp", "layout": "tp2sp", "load": "ckpt-pp2ep2" if resume else None},
    ]
    out = tmp_path_factory.mktemp("layouts")
    return run_plan(assets, out, [spec for spec in plan if spec["name"] in needed], child=child)


# ---- what the ranks returned ------------------------------------------------------------------------


def gathered(outs: list[dict], key: str) -> torch.Tensor:
    """The whole batch's rows of `key`, from the ranks verl collects from (TP rank 0, last stage),
    each holding its data-parallel share."""
    rows: dict[int, torch.Tensor] = {}
    for o in outs:
        if o["coords"]["collect"]:
            for i, row in enumerate(o["rows"]):
                assert row not in rows, f"row {row} came from two data-parallel ranks"
                rows[row] = o[key][i]
    assert sorted(rows) == list(range(len(rows))) and rows, sorted(rows)
    return torch.stack([rows[r] for r in sorted(rows)])


def micro_batch_losses(outs: list[dict], key: str) -> tuple[float, float, float]:
    """(mean pg_loss, mean kl_loss over every micro-batch of every data-parallel rank, grad norm), as
    verl 0.6.0's trainer reduces the collected metrics (lists per micro-batch). The grad norm is global:
    every rank must agree."""
    pg, kl = [], []
    for o in outs:
        if o["coords"]["collect"]:
            pg += [x[0] if isinstance(x, list) else x for x in o[key]["actor/pg_loss"]]
            kl += list(o[key]["actor/kl_loss"])
    norms = {float(o[key]["actor/grad_norm"][0]) for o in outs}
    assert max(norms) - min(norms) <= 1e-12 * max(norms), f"ranks disagree on the gradient norm: {norms}"
    return sum(pg) / len(pg), sum(kl) / len(kl), norms.pop()


@pytest.fixture(scope="module")
def losses():
    """How this stack's verl reports an update's (pg_loss, kl_loss, grad norm): `losses(outs, key)`
    (tests/current/parallel/test_layouts.py gives verl 0.9.1's)."""
    return micro_batch_losses


def close(a: float, b: float, rtol: float = NORM_RTOL) -> bool:
    return abs(a - b) <= rtol * max(abs(a), abs(b))


# ---- the tests ---------------------------------------------------------------------------------------


def test_every_rank_holds_its_own_share(runs):
    """PP2 x EP2: stage 0 holds layers 1-2 (the dense one and an MoE one), stage 1 layers 3-4; expert
    rank e holds experts 4e..4e+3 of every MoE layer; TP2 + SP: each rank all layers, half the experts."""
    by_coord = {(o["coords"]["pp"], o["coords"]["ep"]): o["coords"] for o in runs["pp2ep2"]}
    assert sorted(by_coord) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for (pp, ep), c in by_coord.items():
        assert c["layers"] == ([1, 2] if pp == 0 else [3, 4]), c
        assert c["experts"] == {n: list(range(4 * ep, 4 * ep + 4)) for n in c["layers"] if n > 1}, c
    single = runs["single"][0]["coords"]
    assert single["layers"] == [1, 2, 3, 4] and single["experts"][2] == list(range(8))
    for o in runs["tp2sp"]:
        c = o["coords"]
        assert c["layers"] == [1, 2, 3, 4] and c["experts"][2] == list(range(4 * c["ep"], 4 * c["ep"] + 4))
        assert c["params"] < single["params"]  # a real share, not a replica


@pytest.mark.parametrize("layout", ["pp2ep2", "tp2sp"])
def test_log_probs_equal_the_single_rank_run(runs, layout):
    want, got = gathered(runs["single"], "lp0"), gathered(runs[layout], "lp0")
    assert got.shape == want.shape and want.abs().sum() > 0
    diff = (got - want).abs().max().item()
    assert diff <= LP_ATOL, f"{layout}: log-probs differ from one rank's by {diff:.3g}"
    # the same layout with two experts of expert rank 1 swapped: a wrong placement is caught
    swapped = (gathered(runs[layout], "lpX") - want).abs().max().item()
    assert (
        swapped > 100 * LP_ATOL
    ), f"{layout}: swapping two experts moved the log-probs by {swapped:.3g} only"
    assert torch.equal(gathered(runs["single"], "lpX"), want)  # one rank has no expert rank 1: no swap


@pytest.mark.parametrize("layout", ["pp2ep2", "tp2sp"])
def test_update_step_gives_the_single_rank_loss_and_gradient_norm(runs, layout, losses):
    for step in ("m1", "m2"):
        (pg0, kl0, gn0), (pg, kl, gn) = losses(runs["single"], step), losses(runs[layout], step)
        assert close(pg, pg0) and close(kl, kl0), f"{layout} {step}: losses {pg, kl} vs one rank's {pg0, kl0}"
        assert close(gn, gn0), f"{layout} {step}: gradient norm {gn!r} vs one rank's {gn0!r}"
    for key in ("lp1", "lp2"):  # the updates themselves: the same weights came out
        diff = (gathered(runs[layout], key) - gathered(runs["single"], key)).abs().max().item()
        assert diff <= STEP_ATOL, f"{layout}: log-probs after the update ({key}) differ by {diff:.3g}"
    moved = (gathered(runs["single"], "lp1") - gathered(runs["single"], "lp0")).abs().max().item()
    assert moved > 100 * STEP_ATOL  # the steps changed the model: equality above means something


def test_checkpoint_saved_at_pp2ep2_resumes_at_tp2sp(runs, losses):
    """tp2sp loads pp2ep2's checkpoint (taken after its first step): the same model (log-probs equal
    pp2ep2's after that step), the same optimizer state (the second step repeats pp2ep2's)."""
    saver, loader = runs["pp2ep2"], runs["tp2sp"]
    diff = (gathered(loader, "lpR") - gathered(saver, "lp1")).abs().max().item()
    assert diff <= LP_ATOL, f"resumed model's log-probs differ by {diff:.3g}"
    assert (
        gathered(loader, "lpR") - gathered(loader, "lp2")
    ).abs().max() > 100 * STEP_ATOL  # really reloaded
    (pg0, kl0, gn0), (pg, kl, gn) = losses(saver, "m2"), losses(loader, "m2R")
    assert close(gn, gn0) and close(kl, kl0) and close(pg, pg0), ((pg, kl, gn), (pg0, kl0, gn0))
    diff = (gathered(loader, "lp2R") - gathered(saver, "lp2")).abs().max().item()
    assert diff <= STEP_ATOL, f"the step after resuming differs by {diff:.3g}"
