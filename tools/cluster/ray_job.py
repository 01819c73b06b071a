"""`make ray-job`: a recipe's run on the Ray cluster at HEAD under `make train`'s supervisor.

    make ray-job RECIPE=<recipe> HEAD=<head ip:port> [ARGS='launch.restarts=3 ...'] [SUBMIT=1]
    python -m tools.launch cluster job --recipe <recipe> --address <ip:port> [overrides] [--submit]

The run is `make train`'s (tools/launch/train.py): its run folder, the watchdog, the restarts, the records
and the report, with verl's driver attached to the cluster (RAY_ADDRESS) instead of a Ray of its own; a lost
node is waited for before a restart (tools/cluster/node_wait.py). It runs on the node where it is typed (the
head, or any node of the cluster that sees the run folder). With --submit (SUBMIT=1) the same command is a
Ray job's entrypoint on the head (`ray job submit`): the run outlives the terminal that submitted it
(--no-wait), shows in Ray's dashboard, and `ray job stop` stops it as SIGTERM stops make train.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from tools.cluster.ray_cluster import ClusterError, ray_env, ray_exe


def job(args: argparse.Namespace) -> int:
    """`make ray-job`: `make train`'s supervisor (tools/launch/train.py: the run folder, the watchdog, the
    restarts, the records, the report) with verl's driver attached to the cluster at --address; with
    --submit, that same command as a Ray job's entrypoint on the head (`ray job submit`)."""
    if args.submit:
        return submit(args)
    from tools.launch import train  # Hydra, omegaconf: only for a job

    if args.dashboard_port is not None:  # else the recipe's launch.ray.dashboard_port (node_wait.Cluster.of)
        os.environ["ASCEND_R1_RAY_DASHBOARD_PORT"] = str(args.dashboard_port)
    args.overrides, args.cluster = _overrides(args), args.address
    return train.train(args)


def _overrides(args: argparse.Namespace) -> list[str]:
    return [*(args.set or []), *(args.overrides or [])]


def _recipe_dashboard_port(args: argparse.Namespace) -> int:
    from tools.launch.run import Run  # Hydra, omegaconf: only for a job

    run = Run.compose(args.recipe, _overrides(args), profile=args.profile, backend=args.backend)
    return int((run.launch.get("ray") or {}).get("dashboard_port", 8265))


def submit(args: argparse.Namespace) -> int:
    """The supervised job as a Ray job: its driver on the head under Ray's job server, so the run outlives
    this terminal (--no-wait) and `ray job stop` stops it as SIGTERM stops make train (exit 143)."""
    import shlex

    from tools.recipes.recipe import REPO  # Hydra, omegaconf: only to submit a job

    host = args.address.split(":")[0]
    dash = args.dashboard_port or _recipe_dashboard_port(args)
    inner = [args.python or sys.executable, "-m", "tools.launch", "cluster", "job",
             *(["--recipe", args.recipe] if args.recipe else []), "--address", args.address,
             f"--dashboard-port={dash}",
             *(["--run", args.run] if args.run else []), *(["--fresh"] if args.fresh else []),
             *_overrides(args)]  # fmt: skip
    cmd = [
        ray_exe(),
        "job",
        "submit",
        f"--address=http://{host}:{dash}",
        *(["--no-wait"] if args.no_wait else []),
    ]
    cmd += ["--", "bash", "-c", f"cd {shlex.quote(str(REPO))} && {shlex.join(inner)}"]
    print("submitting:", shlex.join(cmd), flush=True)
    return subprocess.call(cmd, env=ray_env())


def main(argv: list[str]) -> int:
    """`python -m tools.launch cluster job ...`: make train's options, and the cluster's."""
    from tools.launch.train import add_arguments  # Hydra, omegaconf: only for a job

    p = argparse.ArgumentParser(prog="python -m tools.launch cluster job", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add_arguments(p)
    p.add_argument("--set", action="append", help="Hydra override of the recipe (repeatable)")
    p.add_argument(
        "--address", default=os.environ.get("RAY_ADDRESS"), help="head IP:port (default: $RAY_ADDRESS)"
    )
    p.add_argument(
        "--dashboard-port", type=int, default=None, help="default: the recipe's launch.ray.dashboard_port"
    )
    p.add_argument("--submit", action="store_true", help="as a Ray job on the head (ray job submit)")
    p.add_argument("--no-wait", action="store_true", help="with --submit: return once submitted")
    p.add_argument("--python", help="with --submit: python on the head (default: this one)")
    args = p.parse_args(argv)
    if not args.address:
        raise ClusterError("no cluster address", fix="make ray-job HEAD=<head ip:port> (or set RAY_ADDRESS)")
    return job(args)
