"""The settings the published Ascend runs differ by are inputs of the step-time model, read from the recipe
(old log-prob pass, reshard path, the response law's clip ratio), and the [a3-cann] factors: fitted on the
cann-recipes-train random-weights run after the seed + random-weights pair failed to separate fixed costs,
checked on the Qwen3-235B run (held out). docs/plan-time.md has the figures."""

from __future__ import annotations

from dataclasses import replace

import pytest
from omegaconf import OmegaConf

from tools.plan import accuracy as A
from tools.plan import calibrate as C
from tools.plan import calibrate_pair as CP
from tools.plan import factors as F
from tools.plan import runsetup as RS
from tools.plan import timing as T
from tools.plan.factors import FIELDS
from tools.recipes.recipe import compose

RW = "cann-recipes-train DeepSeek-R1 671B, random weights, 128 A3 (256 dies), step 5"
QWEN = "cann-recipes-train Qwen3-235B-A22B 32k, 64 A3 (128 dies), step 1"


def run(name: str) -> C.Published:
    return next(r for r in C.published() if r.name == name)


def test_without_the_old_log_prob_pass_its_phase_costs_nothing():
    s = run(RW).setup
    on = T.step(s.with_(actor=replace(s.actor, old_log_prob=True)), F.shipped("a3-cann")).seconds()
    off = T.step(s, F.shipped("a3-cann")).seconds()
    assert off["old_log_prob"] == 0 and on["old_log_prob"] > 0.5 * on["ref"]
    assert {k: v for k, v in on.items() if k != "old_log_prob"} == {
        k: v for k, v in off.items() if k != "old_log_prob"
    }


def test_the_shard_reshard_path_moves_a_rank_s_shard_not_the_whole_model():
    s = run(RW).setup
    w_shard = T.work(s)
    w_gather = T.work(s.with_(rollout=replace(s.rollout, reshard="gather")))
    assert 0 < w_shard.reshard_link < w_gather.reshard_link / 10


def test_a_clip_ratio_puts_the_longest_response_of_a_wave_at_the_cap():
    mean, cap = 1024.0, 2048
    law = T.Lengths.of(76, mean, cap)
    clipped = T.Lengths.of(76, mean, cap, clip=0.1)
    assert clipped.clip == 0.1 and "clip ratio" in clipped.law
    # 64 sequences, 10% clipped: the wave reaches the cap with probability 1 - 0.9^64 > 0.998
    assert clipped.longest_of(64) == pytest.approx(cap, rel=0.002)
    assert clipped.longest_of(1) < law.longest_of(64)
    assert clipped.response_sq() > 0.1 * cap * cap
    with pytest.raises(ValueError, match="clip x cap must not exceed the mean"):
        T.Lengths.of(76, mean, cap, clip=0.6)


def _cfg(**launch):
    cfg = compose("deepseek-v3-671b-a3", stack="published")
    for k, v in launch.items():
        OmegaConf.update(cfg, k, v, force_add=True)
    return cfg


def test_the_recipe_sets_the_old_log_prob_pass_the_reshard_path_and_the_clip_ratio():
    s = RS.setup_of(_cfg())
    assert s.actor.old_log_prob and s.rollout.reshard == "gather" and s.lengths.clip is None
    cfg = _cfg(
        **{
            "verl.actor_rollout_ref.actor.recompute_old_log_prob": False,
            "launch.reshard_path": "shard",
            "launch.expect.response_clip_ratio": 0.1,
        }
    )
    ex = RS.expected(cfg)
    s = RS.setup_of(cfg, ex.lengths)
    assert not s.actor.old_log_prob and s.rollout.reshard == "shard" and s.lengths.clip == 0.1
    assert "launch.expect.response_clip_ratio" in ex.how
    bypass = RS.setup_of(_cfg(**{"verl.algorithm.rollout_correction.bypass_mode": True}))
    assert not bypass.actor.old_log_prob


@pytest.mark.parametrize(
    "key, value",
    [("launch.reshard_path", "direct"), ("launch.expect.response_clip_ratio", 0.9)],
)
def test_a_bad_setting_names_its_key(key, value):
    cfg = _cfg(**{key: value})
    with pytest.raises(RS.SetupError) as e:
        RS.setup_of(cfg, RS.expected(cfg).lengths)
    assert key in str(e.value)


def test_the_seed_and_random_weights_pair_does_not_separate_fixed_costs():
    """Solved for a rate and a fixed cost a phase, the pair gives a negative value in every phase: the
    optimised run is faster per unit of work, so they are not one stack; [a3-cann] is the random-weights
    run's own rates, without fixed costs, and says so."""
    rw, f, rows = CP.fit_cann()
    assert rw.name == RW and len(rows) == 3
    assert all(x <= 0 or y < 0 for _, x, y in rows), rows
    assert f.layer_pass_s == 0 and f.decode_collective_s == 0 and "negative" in f.source


def test_shipped_a3_cann_factors_are_the_refit():
    _, fitted, _ = CP.fit_cann()
    shipped = F.shipped("a3-cann")
    for k in FIELDS:
        if k == "stack":
            assert shipped.stack == fitted.stack
        else:
            assert getattr(shipped, k) == pytest.approx(getattr(fitted, k), rel=1e-9), k


def test_the_235b_run_is_held_out_and_its_error_is_the_stated_accuracy():
    results = {res["run"].name: res for res in A.validate()}
    q = results[QWEN]
    assert q["run"].factors == "a3-cann" and not q["run"].fitted
    err = q["rows"]["step"][2]
    assert f"{err:+.0%}" in F.shipped("a3-cann").accuracy
    # the fitted run is reproduced phase by phase (one run, six factors)
    for phase, (_, _, e, _) in results[RW]["rows"].items():
        assert abs(e) < 0.01, (phase, e)
