"""Preflight planner: `make plan RECIPE=...` (and `make train` before anything starts).

Every rule gives PASS, WARN, FAIL, SKIP or INFO with the values it looked at and, when it does not pass,
the fix. One module per rule group, each adding Result records to a shared Context (context.py):
  recipe.py         verl accepts every key; transformer overrides are Megatron fields or MindSpeed args
  layout.py         world, actor TP/PP/CP/EP/ETP, pipeline stages, rollout TP/DP/EP, the reference
  batch.py          mini/micro/log-prob batches, engines, max_num_seqs, token budget, steps
  machine.py        patches and pins, versions and the lock, environment variables
  inputs.py         data and weights present, in the right format
  device_memory.py  each phase's resident memory and peak against the device (the model: memory.py)
A bad value (a string, 0, a negative, null where a number is needed) is one FAIL naming the key and the
allowed range; the rules that need it are skipped. output.py prints the table and the JSON object.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from tools import atomic
from tools.plan import batch, device_memory, fault_cost, layout, machine, modes, timeplan
from tools.plan import memory as M
from tools.plan import recipe as recipe_rules
from tools.plan.batch import Batches, data_batches, launch_steps, steps_fix, train_command
from tools.plan.context import FAIL, INFO, PASS, SKIP, WARN, Context, Result
from tools.plan.output import as_json, render
from tools.recipes import recipe as R
from tools.routing import replay_cost

__all__ = [
    "FAIL", "INFO", "PASS", "SKIP", "WARN", "Batches", "Plan", "Result", "as_json", "data_batches",
    "launch_steps", "main", "plan", "render", "steps_fix", "train_command",
]  # fmt: skip


@dataclass
class Plan:
    recipe: str
    results: list[Result]
    estimate: M.Estimate | None
    seconds: float = 0.0
    # the time model fills these (None / empty where it has no prediction)
    time_s: dict[str, float] = field(default_factory=dict)
    step_s: float | None = None
    tokens_per_s_per_device: float | None = None
    tokens_per_s_per_card: float | None = None
    time_accuracy: str = ""  # the stated accuracy of the factors used (factors.toml, refit)
    time_lines: list[str] = field(default_factory=list)  # the time section (timeplan.py)
    search_lines: list[str] = field(default_factory=list)  # SEARCH=1 (search.py)
    validation: dict | None = None  # one validation's cost (validation.py), JSON's "validation"
    modes: list = field(default_factory=list)  # modes.ModeTime per trainer mode (modes.py)
    mode_lines: list[str] = field(default_factory=list)
    fault_lines: list[str] = field(default_factory=list)  # a fault's cost (fault_cost.py)

    @property
    def ok(self) -> bool:
        return not any(r.failed for r in self.results)

    @property
    def fits(self) -> bool:
        """Every phase's peak within the device and no memory rule failed (False without an estimate)."""
        return (
            self.estimate is not None
            and all(ph.peak <= ph.capacity for ph in self.estimate.phases)
            and not any(r.failed for r in self.results if r.group == "memory")
        )

    def by_rule(self, rule: str) -> Result:
        for r in self.results:
            if r.rule == rule:
                return r
        raise KeyError(rule)


def check(ctx: Context) -> None:
    """The rule groups in order; each reads what the earlier ones established."""
    try:
        ctx.arch = M.Arch.from_config(OmegaConf.to_container(ctx.launch.model_config))
    except (TypeError, ValueError) as e:
        ctx.add(
            "recipe",
            "launch.model_config",
            False,
            "-",
            f"launch.model_config is not a model's config.json: {e}",
        )
        return
    recipe_rules.check(ctx)
    layout.check(ctx)
    batch.check(ctx)
    machine.check(ctx)
    device_memory.check(ctx)
    replay_cost.check(ctx)  # routing replay's routed expert ids (tools/routing)


def plan(
    recipe: str,
    overrides: list[str] = (),
    *,
    check_machine: bool = True,
    stack: str | None = None,
    run: Path | None = None,
    search: bool = False,
    cfg: DictConfig | None = None,
    modes_too: bool = True,
) -> Plan:
    """The rules, then the step time (fitted on `run` when given; the layout search with `search`).
    `cfg`: the recipe already composed with the overrides (make train's Run): not composed again."""
    t0 = time.perf_counter()
    try:
        cfg = cfg if cfg is not None else R.compose(recipe, overrides, stack=stack)
    except R.RecipeError as e:
        if "no recipe" in str(e) or "does not run on stack" in str(e):
            raise
        return Plan(recipe, compose_failures(recipe, overrides, e, stack), None, time.perf_counter() - t0)
    ctx = Context(cfg, check_machine=check_machine)
    check(ctx)
    tp = timeplan.check(ctx, run=run, search=search)
    p = Plan(recipe, ctx.results, ctx.estimate, time.perf_counter() - t0)
    timeplan.fill(p, tp)
    p.fault_lines = fault_cost.section(cfg, ctx.arch, p.step_s)
    if tp is not None and modes_too:
        p.modes = mode_times(recipe, overrides, cfg, tp.step, stack, check_machine)
        p.mode_lines = modes.lines(p.modes, cfg.launch.get("device_unit", "device"))
    return p


def mode_times(recipe, overrides, cfg, step, stack, check_machine, checks: int = 4) -> list:
    """Each trainer mode's prediction. separate_async: every whole-node split is timed (modes.predict); the
    fastest ones are planned again for the trainer's share (launch.nodes reduced, expert parallelism
    halved until it divides the smaller world) until the memory model says one fits (weights, gradients
    and optimizer states with the recipe's offloads); shown: the fastest split that fits, and the fastest
    of all when that one does not fit."""
    nodes, per_node = int(cfg.launch.nodes), int(cfg.launch.devices_per_node)
    cands = modes.candidate_splits(nodes, per_node)
    timed = modes.predict(step, [(share, None) for _, share in cands])
    base, seps = timed[:2], sorted(timed[2:], key=lambda m: m.step_s)
    if nodes <= 1:  # one node: the split is of its devices; the memory model plans whole nodes
        return base + seps[:1]
    k_of = {round(share, 6): k for k, share in cands}
    a = "verl.actor_rollout_ref.actor.megatron."
    ep0 = int(OmegaConf.select(cfg, a + "expert_model_parallel_size", default=1) or 1)
    pp = int(OmegaConf.select(cfg, a + "pipeline_model_parallel_size", default=1) or 1)
    tp = int(OmegaConf.select(cfg, a + "tensor_model_parallel_size", default=1) or 1)
    shown = []
    for m in seps[:checks]:
        k = k_of[round(m.split, 6)]
        ep = ep0
        while ep > 1 and (k * per_node) % (ep * pp * tp):
            ep //= 2
        sub = plan(recipe, [*overrides, f"launch.nodes={k}", f"{a}expert_model_parallel_size={ep}"],
                   check_machine=check_machine, stack=stack, modes_too=False)  # fmt: skip
        m.fits = sub.fits
        m.detail += f"; trainer {k} node(s), EP{ep}"
        if m.fits:
            shown.append(m)
            break
        if not shown:
            shown.append(m)  # the fastest of all, which does not fit
    return base + shown


def compose_failures(recipe: str, overrides: list[str], error: Exception, stack: str | None) -> list[Result]:
    """A recipe that does not compose: one FAIL; when an integer interpolation (${mul:...},
    ${int_div:...}) met a value that is not a number, the FAIL names the override that gave it."""
    m = re.search(r"invalid literal for int\(\) with base 10: '(.*)'", str(error))
    named = [o.lstrip("+").partition("=")[0] for o in overrides if m and o.partition("=")[2] == m.group(1)]
    return [
        Result(
            "recipe",
            f"{key} is a whole number >= 1",
            FAIL,
            f"{key}={m.group(1)!r}",
            f"set {key} to a whole number >= 1: the recipe computes sizes from it with ${{mul:...}} / "
            "${int_div:...}",
        )
        for key in named
    ] or [Result("recipe", "the recipe composes", FAIL, f"overrides {list(overrides)}", str(error))]


def main(args) -> int:
    import json

    run = Path(args.run) if getattr(args, "run", None) else None
    p = plan(
        args.recipe,
        args.overrides,
        check_machine=not args.no_env,
        run=run,
        search=getattr(args, "search", False),
    )
    if args.json == "-":
        print(json.dumps(as_json(p), indent=1))
    else:
        print(render(p))
    if args.json and args.json != "-":
        atomic.write_json(Path(args.json), as_json(p))
    return 0 if p.ok else 1
