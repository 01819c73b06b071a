"""The flagship's parallel layout in miniature on the current stack: verl 0.9.1's Megatron actor
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

from tests.published.parallel import test_layouts as published

pytestmark = [pytest.mark.slow, pytest.mark.upstream, pytest.mark.megatron]
# the published test's fixtures and tests; what differs on this stack is what a rank does (child) and how
# verl 0.9.1 reports an update's losses (losses)
assets = published.assets
runs = published.runs
test_every_rank_holds_its_own_share = published.test_every_rank_holds_its_own_share
test_log_probs_equal_the_single_rank_run = published.test_log_probs_equal_the_single_rank_run
test_update_step_gives_the_single_rank_loss_and_gradient_norm = (
    published.test_update_step_gives_the_single_rank_loss_and_gradient_norm
)
test_checkpoint_saved_at_pp2ep2_resumes_at_tp2sp = published.test_checkpoint_saved_at_pp2ep2_resumes_at_tp2sp


@pytest.fixture(scope="module")
def child() -> Path:
    return Path(__file__).with_name("layout_child.py")


def collected_losses(outs: list[dict], key: str) -> tuple[float, float, float]:
    """(pg_loss, kl_loss, grad norm) of an update as verl 0.9.1's trainer logs them (reduce_metrics of the
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


@pytest.fixture(scope="module")
def losses():
    return collected_losses
