"""verl patch `verl-router-replay-measure-the-actor-s-routes-against-the-rollout-s` (current stack).

`actor.megatron.router_replay.measure`: in the old-log-prob pass the Megatron engine records the actor's own
routes beside the rollout's (`rollout.enable_rollout_routing_replay`) and returns, per token, whether their
top-k expert sets differ in any MoE layer (`routing_disagrees`); the V1 trainer logs
`rollout/routing_disagreement` and the share of the rollout/actor probability mismatch those tokens carry
(`verl/utils/debug/metrics.py: calculate_routing_metrics`). With mode `disabled` nothing is replayed; with
`R3` the native routes are recorded while the rollout's are replayed. The record also learns the padded
(BSHD) layout that the CPU recipes' forward uses (it assumed packed THD sequences).

The engine part runs verl's own MegatronEngineWithLMHead.forward_backward_batch on the tiny local-spec
DeepSeek-V3 (MLA + MoE) in a gloo rank (tests/current/patches/routing_measure_child.py): rollout routes equal
to the actor's own but at chosen rows are flagged at exactly those rows, in both sequences of one padded
micro-batch; measuring changes no log-prob.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.conftest import upstream_tree
from tests.current.patches import r3_child

pytestmark = [pytest.mark.upstream, pytest.mark.slow]
CHILD = Path(__file__).parent / "routing_measure_child.py"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    return r3_child.run_child(str(CHILD), tmp_path_factory, "measure.pt")


def test_the_record_of_a_padded_batch_is_each_sequences_own(run) -> None:
    for i, (batched, alone) in enumerate(zip(run["recorded"], run["alone"], strict=True)):
        assert batched.shape == alone.shape == (run["lengths"][i], *alone.shape[1:]), i
        assert torch.equal(batched, alone), f"sequence {i}"
    rows = torch.cat([r.flatten(1) for r in run["recorded"]])
    assert len({tuple(r.tolist()) for r in rows}) > 1, "the routes do not vary: the layout is not tested"


@pytest.mark.parametrize("arm", ["measured", "measured_r3"])
def test_exactly_the_rows_routed_differently_are_flagged(run, arm) -> None:
    for i, flags in enumerate(run[arm]["routing_disagrees"]):
        want = torch.zeros(run["lengths"][i])
        want[run["flipped"][i]] = 1.0
        assert torch.equal(flags, want), f"{arm}, sequence {i}: {flags.tolist()} != {want.tolist()}"


def test_measuring_changes_no_log_prob(run) -> None:
    def gap(a, b) -> float:
        return max(
            float((x - y).abs().max()) for x, y in zip(run[a]["log_probs"], run[b]["log_probs"], strict=True)
        )

    assert gap("measured", "native") == 0.0  # mode disabled: nothing replayed
    assert gap("measured_r3", "plain_r3") == 0.0  # R3: the same replay, measured or not
    assert gap("plain_r3", "native") > 1e-3  # and the replay there is real


def test_measure_with_R2_is_refused() -> None:
    upstream_tree("verl")
    from verl.workers.config.engine import EngineRouterReplayConfig

    with pytest.raises(ValueError, match="R2"):
        EngineRouterReplayConfig(mode="R2", measure=True)
    assert EngineRouterReplayConfig(mode="disabled", measure=True).enabled
    assert not EngineRouterReplayConfig().enabled


def test_the_trainer_metrics_split_the_mismatch_by_route() -> None:
    upstream_tree("verl")
    from verl.protocol import DataProto
    from verl.utils.debug.metrics import calculate_routing_metrics

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    disagrees = torch.tensor(
        [[0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]]
    )  # the padded row's 1 is not counted
    p_rollout = torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]])
    p_actor = torch.tensor([[0.5, 0.1, 0.4, 0.9], [0.3, 0.5, 0.5, 0.5]])
    data = DataProto.from_dict(
        {
            "response_mask": mask,
            "routing_disagrees": disagrees,
            "rollout_log_probs": p_rollout.log(),
            "old_log_probs": p_actor.log(),
        }
    )
    m = calculate_routing_metrics(data)
    assert m["rollout/routing_disagreement"] == pytest.approx(2 / 5)
    # |dp| of the masked tokens: routed differently 0.4 and 0.2, the same route 0.0, 0.1, 0.0
    assert m["rollout/mismatch_routing_share"] == pytest.approx(0.6 / 0.7, rel=1e-5)
    assert m["rollout/mismatch_diff_mean_routed_differently"] == pytest.approx(0.3, rel=1e-5)
    assert m["rollout/mismatch_diff_mean_same_route"] == pytest.approx(0.1 / 3, rel=1e-5)
    empty = calculate_routing_metrics(
        DataProto.from_dict({"response_mask": mask * 0, "routing_disagrees": disagrees})
    )
    assert math.isnan(empty["rollout/routing_disagreement"])
