"""The planner's cost of one validation (tools/launch/plan/validation.py): the flagship's AIME 2024 protocol
(30 problems x 16 samples), tokens and predicted seconds from the step's own generation model."""

from __future__ import annotations

import pytest

from tools.launch.plan import timeplan as TP
from tools.launch.plan import timing as T
from tools.launch.plan import validation as V
from tools.launch.recipe import compose


@pytest.fixture(scope="module")
def flagship() -> TP.TimePlan:
    return TP.plan_time(compose("deepseek-v3-671b-a3"))


def test_flagship_validation_is_aime24_x16_at_the_paper_sampling(flagship: TP.TimePlan) -> None:
    v = flagship.validation
    assert (v.files, v.problems, v.samples, v.temperature, v.top_p) == ("aime24.parquet", 30, 16, 0.6, 0.95)
    assert v.responses == 480 and v.cap == 2048
    assert v.tokens == 480 * flagship.step.setup.lengths.response and v.tokens_at_cap == 480 * 2048
    # the seconds are the generation model's on 30 x 16 sequences, with the step's factors
    s = flagship.step.setup
    again = T.step(s.with_(prompts=30, samples=16, lengths=s.lengths), flagship.step.factors)
    assert v.seconds == pytest.approx(again.phases["generate"].seconds, rel=0.02)
    assert 0 < v.seconds < flagship.step.phases["generate"].seconds
    lines = "\n".join(flagship.lines())
    assert (
        "validation (aime24.parquet: 30 problems (shipped benchmark) x 16 samples at T=0.6, top-p 0.95"
        in lines
    )
    assert f"every trainer.test_freq=5 steps: +{v.seconds / 5:.1f} s a step" in lines
    assert flagship.json()["validation"]["generated_tokens_at_cap"] == 983_040


def test_cost_follows_samples_and_test_freq() -> None:
    base = TP.plan_time(compose("deepseek-v3-671b-a3")).validation
    more = TP.plan_time(
        compose(
            "deepseek-v3-671b-a3",
            ["verl.actor_rollout_ref.rollout.val_kwargs.n=64", "verl.trainer.test_freq=-1"],
        )
    ).validation
    assert more.responses == 4 * base.responses and more.tokens == 4 * base.tokens
    assert more.seconds > base.seconds
    assert more.test_freq is None and "validation only before training" in "\n".join(more.lines(700.0))


def test_unknown_validation_file_gives_no_estimate(tmp_path) -> None:
    cfg = compose("deepseek-v3-671b-a3", [f"verl.data.val_files={tmp_path}/held_out.parquet"])
    assert V.count_problems([f"{tmp_path}/held_out.parquet"])[0] is None
    assert TP.plan_time(cfg).validation is None
