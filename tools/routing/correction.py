"""The `correction` recipe group (recipes/correction/*.yaml) mapped onto the stack's verl keys.

A recipe's `launch.correction` says what the user asked for, the same words on every stack:

    routing_replay: null | R3 | auto  the rollout's routed experts replayed in the actor (MoE, Megatron);
                                      auto (the MoE recipes' default, correction=auto): R3 where it can run
    token_tis_threshold: null | x   token-level truncated importance sampling, weights capped at x

and, beside the correction, `launch.measure_routing: auto | true | false`: count per step the tokens the
rollout and the actor route to different experts (verl's `actor.megatron.router_replay.measure`, this
project's verl patch; `rollout/routing_disagreement` and the mismatch split on the report). `auto` measures
where the stack can (current stack, a Megatron MoE recipe), `true` refuses where it cannot.

`apply(cfg, stack)` writes the verl keys that do it on that stack into cfg.verl, after every other group and
overlay (one override, `correction=r3`, wins over the recipe), or stops with a RecipeError that says why it
cannot be done there (docs/routing-replay.md has the reasons with the upstream file:line).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from tools.errors import UserError

ROUTING_REPLAY_MODES = ("R3",)


class CorrectionError(UserError):
    """A correction that this recipe or stack cannot run."""


def _tis_keys(stack: str, threshold: float) -> dict[str, Any]:
    if (
        stack == "published"
    ):  # verl 0.6.0: algorithm.rollout_is* (verl/trainer/config/ppo_megatron_trainer.yaml)
        return {
            "algorithm.rollout_is": True,
            "algorithm.rollout_is_threshold": threshold,
            "algorithm.rollout_is_level": "token",
            "algorithm.rollout_is_mode": "truncate",
            "actor_rollout_ref.rollout.calculate_log_probs": True,
        }
    return {  # verl 0.9.1: algorithm.rollout_correction (verl/trainer/config/algorithm/rollout_correction.yaml)
        "algorithm.rollout_correction.rollout_is": "token",
        "algorithm.rollout_correction.rollout_is_threshold": threshold,
        "actor_rollout_ref.rollout.calculate_log_probs": True,
    }


def _r3_keys() -> dict[str, Any]:
    # verl 0.9.1: the Megatron engine replays (verl/workers/engine/megatron/transformer_impl.py), the vLLM
    # server asks vLLM for the routed experts (verl/workers/rollout/vllm_rollout/vllm_async_server.py)
    return {
        "actor_rollout_ref.actor.megatron.router_replay.mode": "R3",
        "actor_rollout_ref.rollout.enable_rollout_routing_replay": True,
        "actor_rollout_ref.rollout.calculate_log_probs": True,  # verl's mismatch metrics stay on
    }


def _measure_keys() -> dict[str, Any]:
    # verl 0.9.1 + this project's patch: the engine records the actor's routes beside the rollout's in the
    # old-log-prob pass and the V1 trainer logs rollout/routing_disagreement (verl/utils/debug/metrics.py)
    return {
        "actor_rollout_ref.actor.megatron.router_replay.measure": True,
        "actor_rollout_ref.rollout.enable_rollout_routing_replay": True,
        "actor_rollout_ref.rollout.calculate_log_probs": True,
    }


MEASURE_CHOICES = ("auto", True, False)


def _measure(cfg: DictConfig, stack: str, recipe: str) -> bool:
    """Whether to measure the routing disagreement (launch.measure_routing), or a CorrectionError."""
    want = OmegaConf.select(cfg, "launch.measure_routing", default=False)
    if want not in MEASURE_CHOICES:
        raise CorrectionError(
            f"{recipe}: launch.measure_routing is {want!r}",
            fix="use auto, true or false (recipes/algorithm/)",
        )
    why_not = (
        "the published stack cannot (verl 0.6.0 has no router replay, vLLM 0.9.1 returns no routed experts)"
        if stack == "published"
        else f"launch.backend is {cfg.launch.get('backend')!r}, not megatron"
        if cfg.launch.get("backend") != "megatron"
        else "the model has no routed experts"
        if not _is_moe(cfg)
        else "verl's bypass mode (mode=separate_async) recomputes no old log-probs to compare the routes in"
        if OmegaConf.select(cfg, "verl.algorithm.rollout_correction.bypass_mode", default=False)
        else None
    )
    if want is True and why_not:
        raise CorrectionError(
            f"{recipe}: launch.measure_routing=true, and {why_not}",
            fix="set launch.measure_routing=auto (measure where the stack can) or false",
        )
    return bool(want) and why_not is None


def _replay_possible(cfg: DictConfig, stack: str) -> bool:
    """Whether routing replay R3 runs here: the current stack, the Megatron backend, an MoE model."""
    return stack != "published" and cfg.launch.get("backend") == "megatron" and _is_moe(cfg)


def _is_moe(cfg: DictConfig) -> bool:
    return int(OmegaConf.select(cfg, "launch.model_config.n_routed_experts", default=0) or 0) > 0


def verl_keys(cfg: DictConfig, stack: str) -> dict[str, Any]:
    """The verl keys (dotted, under cfg.verl) that the recipe's launch.correction asks for on `stack`."""
    recipe = OmegaConf.select(cfg, "launch.recipe", default=None) or "this recipe"
    keys = _measure_keys() if _measure(cfg, stack, recipe) else {}
    corr = OmegaConf.select(cfg, "launch.correction", default=None)
    if corr is None:
        return keys
    name = corr.get("name", "?")
    mode = corr.get("routing_replay")
    if mode == "auto":  # the MoE recipes' default: R3 where this stack and recipe can replay routes
        mode = "R3" if _replay_possible(cfg, stack) else None
    if mode is not None:
        if mode not in ROUTING_REPLAY_MODES:
            raise CorrectionError(
                f"{recipe}: launch.correction.routing_replay is {mode!r}",
                fix=f"use one of {', '.join(ROUTING_REPLAY_MODES)}, auto or null (recipes/correction/)",
            )
        if stack == "published":
            raise CorrectionError(
                f"{recipe}: correction={name} needs routing replay, which the published stack cannot do: "
                "verl 0.6.0 has no actor.megatron.router_replay and vLLM 0.9.1 no enable_return_routed_experts",
                fix="run it with STACK=current, or pick correction=tis (token-level truncated IS works on both)",
            )
        if cfg.launch.get("backend") != "megatron":
            raise CorrectionError(
                f"{recipe}: correction={name} replays routes in Megatron's router; launch.backend is "
                f"{cfg.launch.get('backend')!r}",
                fix="pick a megatron recipe, or correction=tis",
            )
        if not _is_moe(cfg):
            raise CorrectionError(
                f"{recipe}: correction={name} is routing replay for a mixture of experts, and this recipe's "
                "model has no routed experts (launch.model_config.n_routed_experts)",
                fix="use correction=tis for a dense model",
            )
        keys.update(_r3_keys())
    threshold = corr.get("token_tis_threshold")
    if threshold is not None:
        if not float(threshold) > 1.0:
            raise CorrectionError(
                f"{recipe}: launch.correction.token_tis_threshold is {threshold}: the cap of an importance "
                "weight must be above 1",
                fix="e.g. 2.0 (verl's default)",
            )
        if OmegaConf.select(cfg, "verl.algorithm.rollout_correction.bypass_mode", default=False):
            raise CorrectionError(
                f"{recipe}: correction={name} adds a truncated IS weight, and this run uses verl's bypass mode "
                "(verl.algorithm.rollout_correction.bypass_mode, mode=separate_async): its PPO ratio is "
                "already taken against the rollout's log-probs, there is no old policy to weight",
                fix="use correction=none or r3 with mode=separate_async, or pick mode=sync / colocate_async",
            )
        keys.update(_tis_keys(stack, float(threshold)))
    return keys


def apply(cfg: DictConfig, stack: str) -> None:
    """Write verl_keys(cfg, stack) into cfg.verl (in place)."""
    keys = verl_keys(cfg, stack)
    with open_dict(cfg):
        for key, value in keys.items():
            OmegaConf.update(cfg.verl, key, value, force_add=True)
