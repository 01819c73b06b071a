"""Recipe rules: verl accepts every key; override_transformer_config keys are Megatron fields or MindSpeed
arguments; the recipe's stated deviations from the published run."""

from __future__ import annotations

from omegaconf import OmegaConf

from tools.errors import UserError
from tools.plan.context import Context
from tools.recipes import recipe as R
from tools.recipes.mcore_fields import MINDSPEED_KEYS, classify, transformer_config_fields


def check(ctx: Context) -> None:
    stack = ctx.launch.stack
    not_here = f"--no-env: stack {stack}'s trees are not made here; `make bootstrap STACK={stack}` makes them"
    try:
        R.verl_config_dir(stack)
        missing = None
    except UserError as e:
        missing = str(e).splitlines()[0]
    if missing and not ctx.check_machine:  # the recipe alone (make plan NO_ENV=1), from another stack's env
        ctx.verl_full = OmegaConf.create(OmegaConf.to_container(ctx.cfg.verl))
        ctx.skip("recipe", "verl accepts every key", f"{not_here} ({missing})")
    else:
        compose_check(ctx)
    if ctx.launch.backend == "megatron":
        if not transformer_config_fields(ctx.arch.mla) and not ctx.check_machine:
            ctx.skip("recipe", "transformer overrides known", f"{not_here} (megatron-core's source)")
        else:
            transformer_overrides(ctx)
    for key, why in (ctx.launch.get("deviations") or {}).items():
        ctx.note("recipe", "deviation from the published run", f"verl.{key}", " ".join(str(why).split()))


def compose_check(ctx: Context) -> None:
    try:
        ctx.verl_full = R.compose_verl(ctx.cfg)
        ctx.add(
            "recipe",
            "verl accepts every key",
            True,
            f"{len(R.verl_items(ctx.cfg))} keys",
            info=f"composed with verl's {R.config_name(ctx.cfg)}.yaml",
        )
    except UserError as e:
        ctx.verl_full = OmegaConf.create(OmegaConf.to_container(ctx.cfg.verl))
        ctx.add("recipe", "verl accepts every key", False, "-", str(e))


def transformer_overrides(ctx: Context) -> None:
    otc = ctx.get("actor_rollout_ref.actor.megatron.override_transformer_config", {}) or {}
    if not isinstance(otc, dict):
        ctx.add(
            "recipe",
            "transformer overrides known",
            False,
            f"override_transformer_config={otc!r}",
            "verl.actor_rollout_ref.actor.megatron.override_transformer_config must be a mapping of "
            "TransformerConfig fields",
        )
        return
    split = classify(list(otc), mla=ctx.arch.mla)
    ctx.add(
        "recipe",
        "transformer overrides known",
        not split["unknown"],
        f"{len(split['megatron'])} Megatron, {len(split['mindspeed'])} MindSpeed, "
        f"unknown: {split['unknown'] or 'none'}",
        "verl drops a key (Megatron)TransformerConfig lacks with only a warning: fix the spelling "
        "(megatron/core/transformer/transformer_config.py) or list it in "
        "tools/recipes/mcore_fields.py MINDSPEED_KEYS if MindSpeed reads it",
    )
    if split["mindspeed"] and ctx.launch.device != "npu":
        ctx.add(
            "recipe",
            "MindSpeed arguments without MindSpeed",
            False,
            ", ".join(split["mindspeed"]),
            f"device is {ctx.launch.device}: no MindSpeed, verl drops these keys "
            f"({'; '.join(MINDSPEED_KEYS[k] for k in split['mindspeed'][:3])}...)",
            warn=True,
        )
