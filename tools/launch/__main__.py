"""python -m tools.launch <command>: the launcher's one command line, behind make's targets.

    train        make train             GRPO through the patched verl (tools/launch/train.py)
    recipes      make recipes           the recipes and config groups
    dry-run      make dry-run           the resolved config and the exact verl command; starts nothing
    plan         make plan              the preflight planner (tools/plan/)
    prepare      make prepare           weights and data to a training-ready state
    report       make report            a run's page, table and plots (tools/report/)
    cluster      make ray-head/-worker/-stop/-job   a Ray cluster for a recipe (tools/cluster/ray_cluster.py)
    slurm, kuberay                      a Slurm script, a KubeRay manifest
    assets, checkpoints                 a recipe's tiny assets (make tiny-assets); verify or seal a checkpoint

A mistake you can fix exits 2 with one `error:` line and a `fix:` line (tools.errors.run_cli).
"""

from __future__ import annotations

import argparse
import sys

from tools import stacks
from tools.errors import run_cli

# verbs whose own module reads the rest of the command line (`python -m tools.launch <verb> --help`)
DELEGATED = {
    "train": "GRPO through the patched verl for a recipe (make train)",
    "cluster": "a Ray cluster for a recipe: head, worker, wait, job, stop, address",
    "assets": "a recipe's tiny model, tokenizer, data and Megatron checkpoint (make tiny-assets)",
    "checkpoints": "verify a checkpoint against its manifest, or seal it",
}


# Each verb imports its own module when it runs (an entry point: nothing imports this module back, so no
# circle can close through it): `make plan` loads nothing of the report, the cluster or the assets.
def delegate(verb: str, argv: list[str]) -> int:
    if verb == "train":
        from tools.launch import train  # verb: Hydra, omegaconf and psutil, only for make train

        return train.main(argv)
    if verb == "cluster" and argv[:1] == ["job"]:  # its own options, make train's
        from tools.cluster import ray_job  # verb: Hydra, omegaconf, only for make ray-job

        return ray_job.main(argv[1:])
    if verb == "cluster":
        from tools.cluster import ray_cluster as cluster  # verb: only for make ray-*

        return cluster.main(argv)
    if verb == "assets":
        from tools.miniature import assets  # verb: only for make tiny-assets

        return assets.main(argv)
    from tools.launch import checkpoints  # verb: only for checkpoints verify|seal

    return checkpoints.main(argv)


def _recipes(args: argparse.Namespace) -> int:
    # recipes need Hydra and omegaconf: loaded by the verbs that compose one (report does not)
    from omegaconf import OmegaConf

    from tools.recipes.recipe import GROUPS, compose, list_group, list_recipes, recipe_stacks, rollout_summary

    every = list(stacks.load())
    width = max(map(len, every))
    print("recipes (make train RECIPE=<name> [STACK=<stack>]; any key can be overridden Hydra style);")
    print("each as it runs on each stack (recipes/for_stack/<stack>/<recipe>.yaml changes it there):")
    for name, _ in list_recipes():
        print(f"  {name}")
        for stack in recipe_stacks(name) or every:  # composed for the stack: its own overlay, its rollout
            cfg = compose(name, stack=stack, resolve=False)
            desc = " ".join(str(OmegaConf.select(cfg, "launch.description", default="") or "").split())
            try:
                rollout = rollout_summary(cfg)
            except Exception:  # noqa: BLE001 - an interpolation only a run can fill: the description alone
                rollout = "rollout: see make dry-run"
            print(f"    {stack:<{width}}  {desc} [{rollout}]")
    print("groups (swap with e.g. hardware=a2-8):")
    for group in GROUPS:
        print(f"  {group + ':':<10} {', '.join(list_group(group))}")
    return 0


def dry_run(recipe: str, overrides: list[str], out=None) -> int:
    """Print the fully resolved recipe and the exact verl command; start nothing."""
    # recipes need Hydra and omegaconf: loaded by the verbs that compose one (report does not)
    from tools.launch.run import Run

    return Run.compose(recipe, overrides).dry_run(out or sys.stdout)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in DELEGATED:
        return delegate(argv[0], argv[1:])
    p = argparse.ArgumentParser(
        prog="python -m tools.launch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    for verb, what in DELEGATED.items():
        sub.add_parser(verb, help=what, add_help=False)
    sub.add_parser("recipes", help="list the recipes and the config groups")
    d = sub.add_parser("dry-run", help="print the resolved config and the exact verl command; start nothing")
    d.add_argument("recipe")
    d.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. verl.data.train_batch_size=256")
    pl = sub.add_parser("plan", help="preflight: layout, batches, versions, env, data, weights, memory")
    pl.add_argument("recipe")
    pl.add_argument("overrides", nargs="*")
    pl.add_argument(
        "--no-env", action="store_true", help="skip the checks of this machine (versions, env, files)"
    )
    pl.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="print the plan as one JSON object instead of the table (make plan JSON=1); with FILE: the "
        "table, and the JSON object written to FILE",
    )
    pl.add_argument(
        "--run",
        metavar="RUN",
        help="fit the step-time model to this run folder's measured phase times (make plan RUN=...)",
    )
    pl.add_argument(
        "--search", action="store_true", help="rank the layouts that fit by step time (make plan SEARCH=1)"
    )
    pr = sub.add_parser(
        "prepare", help="weights and data to a training-ready state (skip done steps, resume)"
    )
    pr.add_argument("recipe")
    pr.add_argument("overrides", nargs="*")
    pr.add_argument("--threads", type=int, default=2)
    r = sub.add_parser(
        "report", help="per-step table, JSONL, PNG plots and one HTML page from verl's metrics"
    )
    r.add_argument("run", nargs="+", help="run folders or verl JSONL metrics files (several: overlaid)")
    r.add_argument("--out", help="output folder (default: <run folder>/report; several: <common>/compare/..)")
    # make's pid: the report reads every RUN= of `make report RUN=a RUN=b` from make's command line
    r.add_argument("--make-pid", help=argparse.SUPPRESS)
    r.add_argument("--devices", type=float, help="devices for tokens/s per device (default: from the run)")
    for name, what in (("slurm", "a Slurm batch script"), ("kuberay", "a KubeRay RayJob manifest")):
        t = sub.add_parser(name, help=f"print {what} for the recipe (nodes, devices, env, the verl command)")
        t.add_argument("recipe")
        t.add_argument("overrides", nargs="*")
    args, extra = p.parse_known_args(argv)
    # Hydra overrides may come after options (`plan R --no-env key=value`): argparse leaves them over
    bad = [x for x in extra if "=" not in x or x.startswith("-")]
    if bad or (extra and not hasattr(args, "overrides")):
        p.error(f"unrecognized arguments: {' '.join(bad or extra)}")
    if getattr(args, "json", None) and "=" in args.json:  # `--json key=value`: an override, not a FILE
        args.overrides, args.json = [*args.overrides, args.json], "-"
    if extra:
        args.overrides = [*args.overrides, *extra]
    if args.cmd == "recipes":
        return _recipes(args)
    if args.cmd == "dry-run":
        return dry_run(args.recipe, args.overrides)
    if args.cmd == "plan":
        from tools.plan import main as plan_main  # Hydra and omegaconf: not for report

        return plan_main(args)
    if args.cmd in ("slurm", "kuberay"):
        # Hydra, omegaconf and yaml: not for report
        from tools.cluster import templates
        from tools.recipes.recipe import compose

        cfg = compose(args.recipe, args.overrides)
        sys.stdout.write(getattr(templates, args.cmd)(cfg))
        return 0
    if args.cmd == "prepare":
        from tools.launch.prepare import main as prepare_main  # Hydra and omegaconf: not for report

        return prepare_main(args)
    if args.cmd == "report":
        from tools.report import main as report_main  # verb: only for make report

        return report_main(args)
    return 2


if __name__ == "__main__":
    run_cli(main)
