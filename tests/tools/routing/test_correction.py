"""recipes/correction: one override turns on routing replay (R3) and/or token-level truncated IS, mapped
onto each stack's own verl keys (tools/routing/correction.py); verl's Hydra and its own validation accept
the result; where a stack cannot do it, the override stops with the reason."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tests.conftest import STACK
from tools.recipes import recipe as R
from tools.routing import correction

pytestmark = pytest.mark.every_stack

MOE_RECIPES = [
    "tiny-cpu",
    "tiny-zero",
    "tiny-cpu-parallel",
    "deepseek-v3-671b-a3",
    "deepseek-v3-671b-a3-async",
]
R3_KEYS = {
    "actor_rollout_ref.actor.megatron.router_replay.mode": "R3",
    "actor_rollout_ref.rollout.enable_rollout_routing_replay": True,
}
TIS_KEYS = {
    "current": {
        "algorithm.rollout_correction.rollout_is": "token",
        "algorithm.rollout_correction.rollout_is_threshold": 2.0,
    },
    "published": {
        "algorithm.rollout_is": True,
        "algorithm.rollout_is_threshold": 2.0,
        "algorithm.rollout_is_level": "token",
        "algorithm.rollout_is_mode": "truncate",
    },
}


def _runs_here(name: str) -> bool:
    return R.runs_on(name, STACK)


def _verl(name: str, choice: str):
    cfg = R.compose(name, [f"correction={choice}"], stack=STACK)
    return cfg, R.compose_verl(cfg)  # verl's own Hydra: raises on a key its config does not have


@pytest.mark.parametrize("name", [n for n in MOE_RECIPES if _runs_here(n)])
def test_tis_is_one_override_on_every_moe_recipe(name: str):
    cfg, verl = _verl(name, "tis")
    for key, want in {**TIS_KEYS[STACK], "actor_rollout_ref.rollout.calculate_log_probs": True}.items():
        assert OmegaConf.select(verl, key) == want, (name, key)
    assert cfg.launch.correction.token_tis_threshold == 2.0
    if STACK == "current":
        assert OmegaConf.select(verl, "actor_rollout_ref.actor.megatron.router_replay.mode") == "disabled"


@pytest.mark.parametrize("name", [n for n in MOE_RECIPES if _runs_here(n)])
def test_r3_is_one_override_on_the_current_stack_and_refused_on_the_published(name: str):
    if STACK == "published":
        with pytest.raises(correction.CorrectionError) as e:
            R.compose(name, ["correction=r3"], stack=STACK)
        assert "verl 0.6.0 has no actor.megatron.router_replay" in str(e.value)
        assert "STACK=current" in e.value.fix
        return
    # the CPU recipes train padded (BSHD) batches: R3 runs there too (the verl patch for padded batches)
    _, verl = _verl(name, "r3-tis")
    for key, want in {**R3_KEYS, **TIS_KEYS["current"]}.items():
        assert OmegaConf.select(verl, key) == want, (name, key)
    # verl's own checks of what it will build
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    validate_config(verl, use_reference_policy=True, use_critic=False)
    assert omega_conf_to_dataclass(verl.actor_rollout_ref.rollout).enable_rollout_routing_replay is True


@pytest.mark.parametrize("name", [n for n in MOE_RECIPES if _runs_here(n)])
def test_the_default_replays_the_routes_where_the_stack_can(name: str):
    """correction=auto, the MoE recipes' default (make bench-routing's measurement, docs/routing-replay.md):
    R3 on the current stack; on the published stack, which cannot replay, the same as correction=none."""
    cfg, verl = _verl(name, "auto")
    assert R.verl_argv(R.compose(name, stack=STACK)) == R.verl_argv(cfg)  # auto is the recipe's default
    mode = OmegaConf.select(verl, "actor_rollout_ref.actor.megatron.router_replay.mode")
    if STACK == "current":
        assert mode == "R3" and OmegaConf.select(
            verl, "actor_rollout_ref.rollout.enable_rollout_routing_replay"
        )
    else:
        assert mode is None  # verl 0.6.0 has no router replay key at all
        assert R.verl_argv(cfg) == R.verl_argv(R.compose(name, ["correction=none"], stack=STACK))
    none = OmegaConf.select(_verl(name, "none")[1], "actor_rollout_ref.actor.megatron.router_replay.mode")
    assert none in (None, "disabled")  # and one override turns it off


def test_auto_replays_nothing_where_replay_cannot_run():
    dense = R.compose("qwen2.5-7b-a2", ["+correction=auto"], stack="current")
    assert "actor_rollout_ref.actor.megatron.router_replay.mode" not in correction.verl_keys(dense, "current")


def test_r3_is_refused_for_a_dense_model_and_a_bad_threshold_is_named():
    with pytest.raises(correction.CorrectionError, match="no routed experts"):
        R.compose("qwen2.5-7b-a2", ["+correction=r3"], stack="current")
    with pytest.raises(correction.CorrectionError, match="token_tis_threshold is 0.5"):
        R.compose(
            "tiny-cpu", ["correction=tis", "launch.correction.token_tis_threshold=0.5"], stack="current"
        )
    with pytest.raises(correction.CorrectionError, match="routing_replay is 'R2'"):
        R.compose(
            "deepseek-v3-671b-a3", ["correction=r3", "launch.correction.routing_replay=R2"], stack="current"
        )
    with pytest.raises(correction.CorrectionError, match="bypass mode"):
        R.compose("tiny-cpu", ["correction=tis", "mode=separate_async"], stack="current")


MEASURE_KEYS = {
    "actor_rollout_ref.actor.megatron.router_replay.measure": True,
    "actor_rollout_ref.rollout.enable_rollout_routing_replay": True,
    "actor_rollout_ref.rollout.calculate_log_probs": True,
}


@pytest.mark.parametrize("name", [n for n in MOE_RECIPES if _runs_here(n)])
def test_the_routing_disagreement_is_measured_where_the_stack_can_and_cheaply(name: str):
    """launch.measure_routing=auto: on for the CPU MoE recipes of the current stack (the verl patch that
    records the actor's routes beside the rollout's); off on the published stack (it cannot) and for the
    flagships (it would carry every sample's routed experts to the actor; their recipe says false)."""
    cfg, verl = _verl(name, "none")
    on = STACK == "current" and not name.startswith("deepseek")
    for key, want in MEASURE_KEYS.items():
        got = OmegaConf.select(verl, key)
        if key.endswith("calculate_log_probs"):  # on for every recipe of the current stack anyway
            assert got is (True if STACK == "current" else got), (name, key, got)
        else:
            assert (got == want) is on, (name, key, got)
    if STACK == "current":
        from verl.utils.config import omega_conf_to_dataclass

        engine = omega_conf_to_dataclass(verl.actor_rollout_ref.actor.megatron.router_replay)
        assert engine.measure is on and engine.mode == "disabled"  # measured, nothing replayed


def test_measuring_the_routing_is_refused_where_it_cannot_run_and_a_bad_value_is_named():
    with pytest.raises(correction.CorrectionError, match="published stack cannot"):
        R.compose("tiny-cpu", ["launch.measure_routing=true"], stack="published")
    with pytest.raises(correction.CorrectionError, match="no routed experts"):
        R.compose("qwen2.5-7b-a2", ["launch.measure_routing=true"], stack="current")
    with pytest.raises(correction.CorrectionError, match="measure_routing is 'sometimes'"):
        R.compose("tiny-cpu", ["launch.measure_routing=sometimes"], stack="current")
    cfg = R.compose("deepseek-v3-671b-a3", ["launch.measure_routing=true", "correction=r3"], stack="current")
    keys = correction.verl_keys(cfg, "current")
    assert keys["actor_rollout_ref.actor.megatron.router_replay.measure"] is True
    assert keys["actor_rollout_ref.actor.megatron.router_replay.mode"] == "R3"
    # auto on a dense recipe, or under separate_async's bypass mode (no old log-probs): off without a word
    assert not correction.verl_keys(R.compose("qwen2.5-7b-a2", stack="current"), "current")
    bypass = correction.verl_keys(R.compose("tiny-cpu", ["mode=separate_async"], stack="current"), "current")
    assert "actor_rollout_ref.actor.megatron.router_replay.measure" not in bypass
    with pytest.raises(correction.CorrectionError, match="bypass mode"):
        R.compose("tiny-cpu", ["mode=separate_async", "launch.measure_routing=true"], stack="current")
