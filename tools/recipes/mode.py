"""The trainer mode a run uses (recipes/mode/*.yaml, docs/async.md), in one line for the terminal and the report.

verl 0.9.1's V1 trainer runs `sync`, `colocate_async` or `separate_async` (trainer.v1.trainer_mode); what
matters to a reader is whether generation and training overlap, how stale a trained sample may be, how
that staleness is corrected, and for separate_async where the rollout runs and what syncs its weights.
"""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from tools.recipes.recipe import trainer_mode


def mode_line(cfg: Any) -> str:
    """What the trainer overlaps (recipes/mode, docs/async.md): the mode verl runs, its staleness bound and
    correction, and for separate_async the weight-sync engine and the rollout's devices."""
    mode = trainer_mode(cfg)
    sel = lambda k, d=None: OmegaConf.select(cfg, k, default=d)  # noqa: E731
    if mode == "sync":
        return "mode sync: generation, then training, then weight sync (nothing overlaps; mode=colocate_async|separate_async)"
    threshold = sel("verl.trainer.v1.sampler.max_off_policy_threshold", 8)
    stale = "unbounded" if threshold is None else f"<= {int(threshold) - 1} step(s)"
    corr = sel("verl.algorithm.rollout_correction.rollout_is")
    bypass = sel("verl.algorithm.rollout_correction.bypass_mode", False)
    if corr:
        corr_text = f"rollout IS {corr} (TIS {sel('verl.algorithm.rollout_correction.rollout_is_threshold')})"
    elif bypass:
        corr_text = "bypass: the rollout's log-probs are the old policy, PPO's clipped ratio the IS weight"
    else:
        corr_text = "no rollout correction"
    if bypass and corr:
        corr_text += ", bypass (the rollout's log-probs as the old policy)"
    line = (f"mode {mode}: staleness {stale} (max_off_policy_threshold {threshold}, "
            f"{sel('verl.trainer.v1.sampler.max_off_policy_strategy', 'drop')}), {corr_text}")  # fmt: skip
    if mode == "separate_async":
        engine = sel("verl.actor_rollout_ref.rollout.checkpoint_engine.backend", "?")
        devices = sel("verl.actor_rollout_ref.rollout.n_gpus_per_node", "?")
        line += f"; rollout on {devices} device(s) of its own, weight sync by the {engine} engine"
    return line
