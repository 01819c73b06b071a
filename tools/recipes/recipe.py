"""Recipes: composed Hydra configs (model x hardware x algorithm) under recipes/, and the verl command they make.

A recipe file has two top-level keys:
    launch:  launcher-only settings (never passed to verl): description, backend, nodes, devices_per_node,
             device, env, paths, verl_add, ...
    verl:    the stack's verl trainer config tree (ppo_megatron_trainer.yaml for backend megatron,
             ppo_trainer.yaml for fsdp), keys exactly as that verl spells them.

Every recipe is composed for one stack (tools.stacks.resolve, `make ... STACK=`): the group file
recipes/stack/<stack>.yaml, then the recipe's own overlay for that stack, recipes/for_stack/<stack>/<recipe>.yaml
(keys that only one stack's verl has, or values that differ), where it has one.

    compose("deepseek-v3-671b-a3", ["verl.data.train_batch_size=256"]) -> DictConfig (resolved)
    verl_argv(cfg) -> ["-m", "verl.trainer.main_ppo", "--config-name", "ppo_megatron_trainer", "k=v", ...]
    list_recipes() -> [(name, description), ...]
    rollout_summary(cfg) -> "vLLM's CPU build in its own server process, TP1; verl 0.9.1"

Keys that verl's base config does not have (MindSpeed / Megatron arguments passed through verl's free-form
`override_transformer_config` dict, say) are only accepted under a prefix listed in `launch.verl_add`
(prefix -> reason); verl_argv passes them with Hydra's `++` (add or override). Every other key is passed
as `key=value`, so verl's own Hydra rejects a misspelt key; tests/tools/recipes/test_recipes.py composes verl's
config with every recipe's argv to catch that before a cluster is booked.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from tools import cpu_kernels, stacks
from tools.errors import UserError
from tools.patches.config import load_upstreams
from tools.routing import correction

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
GROUPS = ("model", "hardware", "algorithm", "mode", "correction", "stack")
VERL_MODULE = "verl.trainer.main_ppo"
CONFIG_NAMES = {"megatron": "ppo_megatron_trainer", "fsdp": "ppo_trainer"}


class RecipeError(UserError):
    """A recipe that cannot be composed or turned into a verl command."""


def _register_resolvers() -> None:
    """`${repo:tools/x.py}` -> absolute path in this checkout; integer arithmetic for derived settings."""
    resolvers = {
        "repo": lambda rel="": str(REPO / rel) if rel else str(REPO),
        "mul": lambda *xs: math.prod(int(x) for x in xs),
        "int_div": lambda a, b: _int_div(int(a), int(b)),
        # launch.cpu_kernels (tools/cpu_kernels.py) as the vLLM engine argument and environment it pins
        "cpu_mla_backend": lambda mode: cpu_kernels.engine_settings(mode)[0].get("attention_backend"),
        "cpu_linear_kernel": lambda mode: cpu_kernels.engine_settings(mode)[1].get(
            cpu_kernels.LINEAR_KERNEL_ENV, "auto"
        ),
    }
    for name, fn in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


def _int_div(a: int, b: int) -> int | str:
    """a // b when exact; otherwise a marker string that the planner reports (layout rules) by name."""
    if b == 0 or a % b:
        return f"not-divisible:{a}/{b}"
    return a // b


_register_resolvers()


def recipes_dir() -> Path:
    return Path(os.environ.get("ASCEND_R1_RECIPES", RECIPES))


def list_recipes(root: Path | None = None) -> list[tuple[str, str]]:
    """(name, description) of every primary recipe (recipes/*.yaml), sorted by name."""
    root = root or recipes_dir()
    out = []
    for path in sorted(root.glob("*.yaml")):
        raw = OmegaConf.load(path)
        desc = OmegaConf.select(raw, "launch.description", default="") or ""
        out.append((path.stem, " ".join(str(desc).split())))
    return out


def rollout_summary(cfg: Any) -> str:
    """What a composed recipe generates with, in words: the engine, where it runs, its TP, verl's version."""
    rollout, launch = cfg.verl.actor_rollout_ref.rollout, cfg.launch
    name, device, tp = rollout.get("name"), launch.get("device"), rollout.get("tensor_model_parallel_size", 1)
    if name == "hf":
        what = "HF rollout (transformers' generate in the actor's workers)"
    elif name == "vllm":
        engine = {"cpu": "vLLM's CPU build", "npu": "vLLM + vllm-ascend"}.get(device, "vLLM")
        where = (
            "in its own server process"
            if launch.get("rollout_mode") == "server"
            else "in the actor's workers"
        )
        ep = rollout.get("expert_parallel_size", 1)
        what = f"{engine} {where}, TP{tp}" + (f" EP{ep}" if isinstance(ep, int) and ep > 1 else "")
    else:
        what = f"rollout {name}"
    return f"{what}; verl {launch.get('verl_version', '?')}"


def recipe_stacks(recipe: str, root: Path | None = None) -> list[str] | None:
    """The stacks a recipe says it runs on (`launch.stacks`), or None: every stack."""
    raw = OmegaConf.load((root or recipes_dir()) / f"{recipe}.yaml")
    listed = OmegaConf.select(raw, "launch.stacks", default=None)
    return None if listed is None else [str(s) for s in listed]


def runs_on(recipe: str, stack: str, root: Path | None = None) -> bool:
    listed = recipe_stacks(recipe, root)
    return listed is None or stack in listed


def list_group(group: str, root: Path | None = None) -> list[str]:
    root = root or recipes_dir()
    return sorted(p.stem for p in (root / group).glob("*.yaml"))


def _closest(name: str, choices: Sequence[str]) -> str:
    import difflib

    near = difflib.get_close_matches(name, choices, n=1)
    return f" (did you mean '{near[0]}'?)" if near else ""


def _dotted_keys(node: Any, prefix: str = "") -> Iterator[str]:
    """Every key of a config tree, dotted (inner nodes too), without resolving interpolations."""
    if isinstance(node, DictConfig):
        for k in node:
            key = f"{prefix}.{k}" if prefix else str(k)
            yield key
            yield from _dotted_keys(node._get_node(k), key)


def _nearest_key(root: Path, recipe: str, stack: str, error: str) -> str | None:
    """For Hydra's "Could not override 'a.b.c'": the existing key of the composed recipe nearest to it."""
    import difflib

    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    m = re.search(r"Could not override '([^']+)'", error)
    if not m:
        return None
    wrong = m.group(1)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(root), version_base="1.3", job_name="ascend-r1"):
            cfg = hydra_compose(config_name=recipe, overrides=[f"stack={stack}"])
    except Exception:  # noqa: BLE001 - the recipe itself does not compose: no suggestion
        return None
    finally:
        GlobalHydra.instance().clear()
    keys = list(_dotted_keys(cfg))
    parent = wrong.rpartition(".")[0]
    siblings = [k for k in keys if k.rpartition(".")[0] == parent]  # a typo in the last part, first
    near = difflib.get_close_matches(wrong, siblings, n=1, cutoff=0.6) or difflib.get_close_matches(
        wrong, keys, n=1, cutoff=0.6
    )
    return near[0] if near else None


def compose(
    recipe: str, overrides: Sequence[str] = (), *, resolve: bool = True, stack: str | None = None
) -> DictConfig:
    """Compose recipes/<recipe>.yaml for a stack (tools.stacks.resolve) with Hydra's compose API;
    `overrides` in Hydra syntax.

    `verl.actor_rollout_ref.rollout.n=8`, `hardware=a2-8` (swap a group), `+verl.x.y=1` (add a key).
    The result is resolved (interpolations and `${repo:}` paths filled in) unless resolve=False.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    root = recipes_dir()
    names = [n for n, _ in list_recipes(root)]
    if recipe.endswith(".yaml"):
        recipe = Path(recipe).stem
    if recipe not in names:
        raise RecipeError(
            f"no recipe '{recipe}' in {root}{_closest(recipe, names)}",
            fix=f"pick one of: {', '.join(names)}  (make recipes lists them)",
        )
    chosen = stacks.resolve(stack).name
    if not runs_on(recipe, chosen, root):
        listed = recipe_stacks(recipe, root)
        raise RecipeError(
            f"recipe '{recipe}' does not run on stack {chosen} (launch.stacks: {', '.join(listed)})",
            fix=f"use it with STACK={listed[0]}, or pick a recipe of stack {chosen}: "
            + ", ".join(n for n in names if runs_on(n, chosen, root)),
        )
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(root), version_base="1.3", job_name="ascend-r1"):
            cfg = hydra_compose(config_name=recipe, overrides=[f"stack={chosen}", *overrides])
    except (HydraException, OmegaConfBaseException) as e:
        near = _nearest_key(root, recipe, chosen, str(e))
        raise RecipeError(
            f"recipe '{recipe}' with overrides {list(overrides)} does not compose: {e}"
            + (f"\n  the nearest existing key: {near}" if near else ""),
            fix=(f"did you mean {near}? " if near else "")
            + "overrides are Hydra style: existing keys as key=value (verl.data.train_batch_size=256), "
            "new keys as +key=value, groups as model=<name>; `make recipes` lists groups and recipes",
        ) from None
    finally:
        GlobalHydra.instance().clear()
    for top in ("launch", "verl"):
        if top not in cfg:
            raise RecipeError(f"recipe '{recipe}' has no top-level '{top}:' key", fix="see recipes/README.md")
    extra = set(cfg.keys()) - {"launch", "verl"}
    if extra:
        raise RecipeError(
            f"recipe '{recipe}' has top-level keys {sorted(extra)}; only 'launch' and 'verl' are allowed",
            fix="put launcher settings under launch: and verl's config under verl:",
        )
    _check_mode(cfg, recipe, chosen)
    OmegaConf.set_struct(cfg, False)
    cfg.launch.recipe = recipe
    cfg.launch.overrides = list(overrides)
    OmegaConf.set_struct(cfg, True)
    correction.apply(cfg, chosen)  # recipes/correction -> this stack's verl keys (tools/routing)
    if resolve:
        try:
            OmegaConf.resolve(cfg)
        except (OmegaConfBaseException, UserError) as e:
            raise RecipeError(f"recipe '{recipe}': cannot resolve an interpolation: {e}") from None
    backend = cfg.launch.get("backend")
    if backend not in CONFIG_NAMES:
        raise RecipeError(
            f"recipe '{recipe}': launch.backend is {backend!r}",
            fix=f"set launch.backend to one of {sorted(CONFIG_NAMES)}",
        )
    return cfg


def _check_mode(cfg: DictConfig, recipe: str, stack: str) -> None:
    """The trainer mode (recipes/mode, docs/async.md) runs on this stack's verl: async modes need verl 0.9's V1."""
    mode = cfg.launch.get("mode")
    if mode is None:
        return
    listed = [str(s) for s in (mode.get("stacks") or [])]
    if listed and stack not in listed:
        raise RecipeError(
            f"recipe '{recipe}': mode={mode.name} (launch.mode.stacks: {', '.join(listed)}) does not run on stack "
            f"{stack}: its verl has no V1 trainer modes",
            fix=f"use it with STACK={listed[0]}, or drop the override (mode=sync)",
        )


def trainer_mode(cfg: DictConfig) -> str:
    """The mode verl will run: verl.trainer.v1.trainer_mode where the recipe sets it (also through a `+`
    override), else sync (verl 0.9.1's default; verl 0.6 has only sync)."""
    return str(OmegaConf.select(cfg, "verl.trainer.v1.trainer_mode", default=None) or "sync")


# ---- the verl command -------------------------------------------------------------------------------

_BARE = re.compile(r"^[A-Za-z_/.~][\w./~:@+-]*$")
_RESERVED = {"true", "false", "null", "none", "nan", "inf", "-inf", "+inf"}


def hydra_value(value: Any) -> str:
    """A Python/OmegaConf value as a Hydra override value that parses back to the same value."""
    if isinstance(value, DictConfig | ListConfig):
        value = OmegaConf.to_container(value, resolve=True)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if _BARE.match(text) and text.lower() not in _RESERVED and not _looks_numeric(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _leaves(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """Dotted leaf keys. Empty dicts/lists and lists are leaves (passed whole)."""
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, node


def verl_items(cfg: DictConfig) -> list[tuple[str, Any, bool]]:
    """(dotted verl key, value, added) for every leaf of cfg.verl; added = under a launch.verl_add prefix."""
    tree = OmegaConf.to_container(cfg.verl, resolve=True)
    prefixes = list((cfg.launch.get("verl_add") or {}).keys())
    out = []
    for key, value in _leaves(tree, ""):
        added = any(key == p or key.startswith(p + ".") for p in prefixes)
        out.append((key, value, added))
    return out


def config_name(cfg: DictConfig) -> str:
    return CONFIG_NAMES[cfg.launch.backend]


def verl_overrides(cfg: DictConfig) -> list[str]:
    return [f"{'++' if added else ''}{key}={hydra_value(value)}" for key, value, added in verl_items(cfg)]


def verl_argv(cfg: DictConfig) -> list[str]:
    """The arguments after `python`: ["-m", "verl.trainer.main_ppo", "--config-name", <name>, "k=v", ...]."""
    return ["-m", VERL_MODULE, "--config-name", config_name(cfg), *verl_overrides(cfg)]


def verl_env(cfg: DictConfig) -> dict[str, str]:
    """launch.env as strings (what the launcher exports for the driver and, through Ray, the workers)."""
    env = OmegaConf.to_container(cfg.launch.get("env") or {}, resolve=True)
    return {
        str(k): "" if v is None else (str(v).lower() if isinstance(v, bool) else str(v))
        for k, v in env.items()
    }


def world_size(cfg: DictConfig) -> int:
    return int(cfg.launch.nodes) * int(cfg.launch.devices_per_node)


@functools.cache
def verl_config_dir(stack: str | None = None) -> Path:
    """verl's trainer config folder in the stack's verl tree (third_party/verl for the default stack, after make bootstrap)."""
    up = load_upstreams(REPO, stack)["verl"]
    path = up.tree / "verl" / "trainer" / "config"
    if not (path / "ppo_trainer.yaml").is_file():
        raise RecipeError(
            f"verl's trainer configs are missing at {path}",
            fix=f"run `make bootstrap STACK={up.stack}` (it makes {up.path} from the pinned release)",
        )
    return path


def compose_verl(cfg: DictConfig) -> DictConfig:
    """verl's own trainer config composed with the recipe's overrides, exactly as main_ppo would see it.

    Raises RecipeError naming the key when verl's Hydra rejects an override (a misspelt or moved key).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = verl_overrides(cfg)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(
            config_dir=str(verl_config_dir(cfg.launch.stack)), version_base=None, job_name="verl"
        ):
            return hydra_compose(config_name=config_name(cfg), overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        msg = str(e).splitlines()[0]
        m = re.search(r"Key '([^']+)'|Could not override '([^']+)'", str(e))
        key = next((g for g in (m.groups() if m else ()) if g), None)
        raise RecipeError(
            f"verl {cfg.launch.get('verl_version', '?')} ({config_name(cfg)}.yaml) rejects the recipe's verl keys: {msg}",
            fix=(
                f"verl.{key} is not a key of verl's config: check its spelling against "
                f"{verl_config_dir(cfg.launch.stack)}/_generated_{config_name(cfg)}.yaml, or list its parent under "
                "launch.verl_add if verl really takes free-form keys there"
                if key
                else "check the key against verl's generated reference config"
            ),
        ) from None
    finally:
        GlobalHydra.instance().clear()


def shell_command(cfg: DictConfig, python: str = "python") -> str:
    """The verl command as one copy-pasteable shell line (env first)."""
    import shlex

    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in verl_env(cfg).items())
    argv = " ".join(shlex.quote(a) for a in [python, *verl_argv(cfg)])
    return f"{env} {argv}".strip()
