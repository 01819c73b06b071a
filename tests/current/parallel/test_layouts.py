"""The flagship's parallel layout in miniature on the current stack (issue 17): verl 0.9.1's Megatron actor
gives the same numbers at every parallel layout as on one rank, and a checkpoint saved at one layout resumes
at another.

The published stack's test (tests/published/parallel/test_layouts.py) with verl 0.9.1's worker: its plan
runner, layouts, assets and checks are imported from there; what a rank does is
tests/current/parallel/layout_child.py. The model is the recipe tiny-cpu-parallel's on this stack (a tiny
DeepSeek-V3 shaped for vLLM's CPU MLA: 4 layers with the first dense, 8 routed experts, the all-to-all
token dispatcher), in fp32, at

    single    1 rank                                   the reference
    pp2ep2    4 ranks: PP2 x EP2 (DP2, expert-DP 1)   the recipe's layout (the 671B run: PP8 x EP32)
    tp2sp     2 ranks: TP2 + SP, EP2, ETP1              what Megatron requires for TP with MoE

Each layout computes the log-probs of one fixed batch (each data-parallel rank its share, as verl's
dispatch gives it), takes two update steps (GRPO loss with the KL term, the distributed optimizer, gradient
clipping, MoE expert-bias updates), and computes the log-probs after each. pp2ep2 saves a checkpoint after
its first step (the optimizer fully reshardable, as the recipe sets it); tp2sp loads it after its own steps
and repeats pp2ep2's second step from it. Each layout also computes the log-probs once with two experts of
expert rank 1 swapped: the tolerance must catch that.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.published.parallel import test_layouts as published
from tests.published.parallel.test_layouts import (
    LP_ATOL,
    NEEDS,
    STEP_ATOL,
    close,
    gathered,
    needed_layouts,
    run_plan,
)

pytestmark = [pytest.mark.slow, pytest.mark.upstream, pytest.mark.megatron]
CHILD = Path(__file__).with_name("layout_child.py")
# the published test's: the recipe's tiny model and Megatron checkpoint (a fixture), and its check of which
# layers and experts each rank holds (collected here too, on this stack's runs)
assets = published.assets
test_every_rank_holds_its_own_share = published.test_every_rank_holds_its_own_share


@pytest.fixture(scope="module")
def runs(request, assets, tmp_path_factory) -> dict[str, list[dict]]:
    needed = needed_layouts(request.session.items, __file__, NEEDS) or {"single", "pp2ep2", "tp2sp", "resume"}
    resume = "resume" in needed
    plan = [
        {"name": "single", "layout": "single"},
        {"name": "pp2ep2", "layout": "pp2ep2", "save": "ckpt-pp2ep2" if resume else None},
        {"name": "tp2sp", "layout": "tp2sp", "load": "ckpt-pp2ep2" if resume else None},
    ]
    out = tmp_path_factory.mktemp("layouts")
    return run_plan(assets, out, [spec for spec in plan if spec["name"] in needed], child=CHILD)


def losses(outs: list[dict], key: str) -> tuple[float, float, float]:
    """(pg_loss, kl_loss, grad norm) of an update as verl's trainer logs them (reduce_metrics of the
    collecting ranks' metrics, already gathered over data-parallel ranks by the worker). Every collecting
    rank must report the same."""
    seen = {
        tuple(
            float(sum(v) / len(v)) if isinstance(v, list) else float(v)
            for v in (o[key]["actor/pg_loss"], o[key]["kl_loss"], o[key]["grad_norm"])
        )
        for o in outs
        if o["coords"]["collect"]
    }
    assert len(seen) == 1, f"the collecting ranks disagree: {seen}"
    return seen.pop()


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
def test_update_step_gives_the_single_rank_loss_and_gradient_norm(runs, layout):
    for step in ("m1", "m2"):
        (pg0, kl0, gn0), (pg, kl, gn) = losses(runs["single"], step), losses(runs[layout], step)
        assert close(pg, pg0) and close(kl, kl0), f"{layout} {step}: losses {pg, kl} vs one rank's {pg0, kl0}"
        assert close(gn, gn0), f"{layout} {step}: gradient norm {gn!r} vs one rank's {gn0!r}"
    for key in ("lp1", "lp2"):  # the updates themselves: the same weights came out
        diff = (gathered(runs[layout], key) - gathered(runs["single"], key)).abs().max().item()
        assert diff <= STEP_ATOL, f"{layout}: log-probs after the update ({key}) differ by {diff:.3g}"
    moved = (gathered(runs["single"], "lp1") - gathered(runs["single"], "lp0")).abs().max().item()
    assert moved > 100 * STEP_ATOL  # the steps changed the model: equality above means something


def test_checkpoint_saved_at_pp2ep2_resumes_at_tp2sp(runs):
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
