"""The trainer-mode group (recipes/mode/*.yaml): every recipe takes mode=, sync by default; each async mode
maps to verl 0.9.1's keys (verl's own config composes them); the published stack refuses an async mode
naming the key and the fix; make train's mode line says what runs."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from tools.patches.config import tree_of
from tools.recipes import recipe as R
from tools.recipes.mode import mode_line

# the async modes are verl 0.9.1's (the current stack): composing verl's own config with them needs the
# current stack's verl tree, which a checkout bootstrapped for the published stack alone does not have
NEEDS_CURRENT_VERL = pytest.mark.skipif(
    not (tree_of("verl", "current") / "verl" / "trainer" / "config" / "ppo_trainer.yaml").is_file(),
    reason="the current stack's verl tree is not here (this checkout is not bootstrapped for STACK=current: "
    "make bootstrap STACK=current)",
)


@pytest.mark.parametrize("recipe", [n for n, _ in R.list_recipes() if R.runs_on(n, "current")])
def test_every_recipe_defaults_to_sync(recipe):
    cfg = R.compose(recipe, [], stack="current")
    if recipe.endswith("-async"):
        assert R.trainer_mode(cfg) != "sync"
        return
    assert cfg.launch.mode.name == "sync" and R.trainer_mode(cfg) == "sync"
    assert "nothing overlaps" in mode_line(cfg)


def verl_of(mode: str):
    cfg = R.compose("tiny-cpu", [f"mode={mode}"], stack="current")
    return cfg, R.compose_verl(cfg)


@NEEDS_CURRENT_VERL
def test_colocate_async_keys():
    cfg, v = verl_of("colocate_async")
    assert v.trainer.v1.trainer_mode == "colocate_async"
    assert v.trainer.v1.sampler.max_off_policy_threshold == 2  # staleness 1
    assert (
        v.algorithm.rollout_correction.rollout_is == "token"
        and not v.algorithm.rollout_correction.bypass_mode
    )
    assert v.actor_rollout_ref.rollout.calculate_log_probs
    assert "staleness <= 1" in mode_line(cfg) and "TIS 2.0" in mode_line(cfg)


@NEEDS_CURRENT_VERL
def test_separate_async_keys_and_the_cpu_engine():
    cfg, v = verl_of("separate_async")
    assert v.trainer.v1.trainer_mode == "separate_async"
    assert v.actor_rollout_ref.hybrid_engine is False
    assert v.actor_rollout_ref.rollout.n_gpus_per_node == 1
    ce = v.actor_rollout_ref.rollout.checkpoint_engine
    assert (ce.backend, ce.custom_backend_module) == ("gloo", "tools.verl_plugins.gloo_engine")
    # verl asserts train_batch_size == parameter_sync_step x ppo_mini_batch_size
    assert (
        v.data.train_batch_size
        == v.trainer.v1.separate_async.parameter_sync_step * v.actor_rollout_ref.actor.ppo_mini_batch_size
    )
    assert v.algorithm.rollout_correction.bypass_mode
    # verl's bypass loss, which the on-policy patch leaves alone: under "vanilla" it took the rollout's
    # log-probs for its own and set the ratio to 1 (the one-step staleness uncorrected; tiny-learn did not learn)
    assert v.actor_rollout_ref.actor.policy_loss.loss_mode == "bypass_mode"
    assert "gloo engine" in mode_line(cfg)
    assert R.verl_env(cfg)["PYTHONPATH"] == str(R.REPO)


def test_the_npu_hardware_syncs_with_hccl():
    cfg = R.compose("deepseek-v3-671b-a3", ["mode=separate_async"], stack="current")
    assert cfg.verl.actor_rollout_ref.rollout.checkpoint_engine.backend == "nccl"  # HCCL on Ascend


def test_an_async_mode_on_the_published_stack_is_refused():
    with pytest.raises(R.RecipeError) as e:
        R.compose("tiny-cpu", ["mode=colocate_async"], stack="published")
    assert "launch.mode.stacks" in str(e.value) and "STACK=current" in e.value.fix


@NEEDS_CURRENT_VERL
def test_the_flagship_async_variant():
    cfg = R.compose("deepseek-v3-671b-a3-async", [], stack="current")
    v = R.compose_verl(cfg)
    assert v.trainer.v1.trainer_mode == "colocate_async"
    assert cfg.launch.published.time_per_step_s == 1338.3  # the flagship's own settings are kept


@NEEDS_CURRENT_VERL
def test_the_recipes_pythonpath_joins_the_users(monkeypatch, tmp_path):
    """separate_async puts the checkout on verl's PYTHONPATH (its workers import the gloo engine by name):
    a PYTHONPATH of the user's (or a test's fault injection) stays first, rather than being replaced."""
    from tools.launch.run import Run

    monkeypatch.setenv("ASCEND_R1_STACK", "current")  # the async modes are the current stack's
    run = Run.compose("tiny-cpu", ["mode=separate_async"], outputs=tmp_path, profile="cpu")
    run = replace(run, env={"PYTHONPATH": str(R.REPO)})
    monkeypatch.setenv("PYTHONPATH", "/mine")
    assert run.environ(1)["PYTHONPATH"] == f"/mine{os.pathsep}{R.REPO}"
    monkeypatch.delenv("PYTHONPATH")
    assert run.environ(1)["PYTHONPATH"] == str(R.REPO)
