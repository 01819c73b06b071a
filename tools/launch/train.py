"""`make train`: run GRPO through the patched verl for a recipe, and report it.

    make train                          # the embedded default: recipe tiny-cpu (Megatron actor) on this machine
    make train BACKEND=fsdp             # the same run with verl's FSDP2 actor (recipe tiny-cpu-fsdp)
    make train RECIPE=<name> ARGS='verl.data.train_batch_size=8 launch.steps=5'

What it does: composes the recipe once into a Run (tools/launch/run.py), makes the tiny model, tokenizer,
data and Megatron checkpoint when the recipe uses them and they are missing (tools/miniature/assets.py), checks
the trees, the plan and the data (tools/launch/preflight.py), starts verl's `main_ppo` (which starts a local
Ray; tools/launch/supervise.py), shows one table row per GRPO step, and writes the run folder

    outputs/<stack>/<run>/  config.yaml  command.txt  verl.log  metrics.jsonl  steps.md  reward.png
                    response_length.png  timeline.json  checkpoints/  verl-metrics-<attempt>.jsonl  report/
                    prompts.jsonl (each trained step's prompts: tools/launch/prompt_record.py)

`make ray-job` (tools/cluster/ray_job.py) runs this same supervisor with verl's driver attached
to the Ray cluster at HEAD instead of a local Ray, and waits for a lost node before a restart
(tools/cluster/node_wait.py).

Validation runs before training and at the end; a checkpoint is saved at the end and the next
`make train` of the same run resumes from it (training `launch.steps` more steps). Ctrl-C or SIGTERM
stops verl and every process it started (Ray included). A second `make train` in the same checkout
while one runs refuses, naming the run folder.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from omegaconf import OmegaConf

from tools import atomic, cpu_kernels
from tools.analysis import learning
from tools.cluster import node_wait
from tools.errors import INTERRUPTED, TERMINATED, MachineFault, Stopped, run_cli, stop_on_sigterm
from tools.launch import checkpoints, preflight, prompt_record, restart, restart_records, resume, watchdog
from tools.launch import run as run_mod
from tools.launch.run import Run, TrainError, checkout_lock
from tools.launch.supervise import EXIT_FAILED, RAY_START_TRIES, ray_start_timed_out, run_verl
from tools.miniature import assets, final_eval
from tools.plan import launch_steps
from tools.recipes.mode import mode_line
from tools.report import finish, live
from tools.report.runs import responses_per_step

REPO = Path(__file__).resolve().parents[2]
OUTPUTS = run_mod.OUTPUTS  # tests point it elsewhere
LOCK = OUTPUTS / ".train.lock"
__all__ = ["TrainError", "add_arguments", "main", "train"]


def train(a: argparse.Namespace) -> int:
    out, t0 = sys.stdout, time.time()
    log = lambda m: (out.write(m + "\n"), out.flush())  # noqa: E731
    run = Run.compose(a.recipe, a.overrides, outputs=OUTPUTS, profile=a.profile, backend=a.backend,
                      name=a.run, fresh=a.fresh)  # fmt: skip
    if a.dry_run:
        return run.dry_run(out)
    preflight.machine(run)  # a cluster recipe on a CPU machine: said first, nothing made
    cluster = None
    if getattr(a, "cluster", None):  # make ray-job: verl's driver attaches to the cluster at this address
        run = replace(run, ray_address=a.cluster)
        cluster = node_wait.Cluster.of(run.launch, a.cluster)  # launch.ray.node_wait_s checked here
    rules, composed = restart.policy(run.launch), run  # launch.restarts checked before anything starts
    with stop_on_sigterm(), checkout_lock(LOCK, run.folder):
        try:
            run = prepare(run, a, out, log)
            if cluster is not None:
                attach(run, cluster, out)
        except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM before verl: what was being made is removed
            by_term = isinstance(stop, Stopped)
            out.write(
                f"stopped ({'SIGTERM' if by_term else 'Ctrl-C'}) before verl started; run folder {run.folder}\n"
            )
            return TERMINATED if by_term else INTERRUPTED
        history: list[tuple[restart.Fault, int]] = []
        starts: list[float] = []
        until = int(run.cfg.verl.trainer.total_training_steps)  # a restart trains up to the same step
        while True:
            before = cluster.alive() if cluster is not None else []  # a node gone after this is named
            rc, records, timeline, attempt = start_verl(run, out)
            sealed = checkpoints.seal_new(run.checkpoints, after=run.start, log=log)  # manifests of the saves
            unlogged = live.record_attempt(run, attempt, records, timeline, time.time() - t0, saved=sealed)
            for step in unlogged:
                log(
                    f"step {step}: {live.UNLOGGED} (its checkpoint is kept; its row in metrics.jsonl says so)"
                )
            if history:  # the restart before this attempt: how long until a step came again
                restart_records.first_step(run.folder, timeline, log)
            trained = sorted({s for s, d in records if live.is_train_step(d)} | set(unlogged))
            # the prompts each trained step trained on (prompts.jsonl), from the reward tally
            prompt_record.add_attempt(
                run.folder, attempt, responses_per_step(run.cfg), run.start + 1, trained
            )
            fault = restart.classify(rc, timeline, (max(trained) if trained else run.start) + 1)
            if fault is not None and cluster is not None:
                fault = cluster.name_lost(fault, before)
            why = None
            if fault is not None:
                why = restart.give_up(fault, history, len(trained), time.time(), rules, starts, last=until)
                if why is None and cluster is not None:  # the lost node back, or a replacement, in time
                    why = cluster.wait_back(fault)
            if fault is None or why is not None:
                return outcome(run, rc, records, timeline, attempt, out, unlogged, fault, why)
            log(f"\n{fault.kind} at step {fault.step}: restarting ({len(starts) + 1} of launch.restarts"
                f" {rules.limit}) from the last sealed, verified checkpoint")  # fmt: skip
            stopped_at = time.time()
            again = argparse.Namespace(**{**vars(a), "resume_from": None, "no_plan": True})
            run, damage = restart_point(replace(composed, fresh=False), again, out, log, until)
            restart_records.add(
                run.folder, attempt, fault, timeline, trained, run.start, stopped_at, log, damage
            )
            history.append((fault, run.start))
            starts.append(stopped_at)


def prepare(run: Run, a: argparse.Namespace, out: TextIO, log: Any, until: int | None = None) -> Run:
    """Everything before verl: the trees, the resume point, the assets, the plan and the batches checked;
    the run's config.yaml and command.txt. The Run, resumed from its checkpoint where there is one;
    `until` (a restart): train up to that step, not launch.steps more."""
    preflight.trees(run.cfg, run.profile)
    run.folder.mkdir(parents=True, exist_ok=True)
    out.write(f"make train: stack {run.stack}, recipe {run.recipe} (backend {run.launch.backend},"
              f" {run.launch.device}); run folder {run.folder}\n")  # fmt: skip
    out.write(mode_line(run.cfg) + "\n")
    if run.on_cpu:
        rollout = OmegaConf.select(run.cfg, "verl.actor_rollout_ref.rollout.name", default="?")
        out.write(cpu_kernels.describe(run.launch.get("cpu_kernels", "native"), rollout) + "\n")
    steps = launch_steps(run.cfg)  # a whole number >= 1, else refused naming launch.steps
    start = resume.prepare(  # verified against its manifest; later checkpoints and records set aside
        run.folder, fresh=run.fresh, resume_from=a.resume_from, recipe=run.recipe, stack=run.stack,
        overrides=run.user_args, log=log, redraw=lambda kept: live.redraw(run.folder, kept),
    )  # fmt: skip
    if until is not None:
        steps = until - start
    make_assets(run, start, steps, log)
    if not a.no_plan:
        preflight.planner(run, out)
    preflight.batches(run, start, steps)
    run = run.resumed(start, steps)
    if start:
        out.write(f"resuming from the checkpoint {run.checkpoints}/global_step_{start}:"
                  f" training steps {start + 1}..{start + steps}\n")  # fmt: skip
    atomic.write_bytes(run.folder / "config.yaml", OmegaConf.to_yaml(run.cfg).encode())
    atomic.write_bytes(run.folder / "command.txt", (" ".join([sys.executable, *run.argv]) + "\n").encode())
    return run


def restart_point(
    run: Run, a: argparse.Namespace, out: TextIO, log: Any, until: int
) -> tuple[Run, checkpoints.Damage | None]:
    """prepare() for a restart. When the latest checkpoint is damaged (a file missing, truncated or changed
    since it was sealed), the restart falls back to the last intact checkpoint before it, says so in one line
    and returns the damage for the restart's row; with no intact checkpoint before it, the damage stops the
    run as the user's to fix (exit 2, the fix lines of tools/launch/resume.py)."""
    try:
        return prepare(run, a, out, log, until=until), None
    except checkpoints.CheckpointError:
        damage = checkpoints.damaged_latest(run.checkpoints)
        if damage is None or damage.intact is None:
            raise
    log(f"checkpoint global_step_{damage.step} is damaged ({damage.problem}): restarting from the last intact"
        f" checkpoint, step {damage.intact} (global_step_{damage.step} is moved aside, kept)")  # fmt: skip
    back = argparse.Namespace(**{**vars(a), "resume_from": damage.intact})
    return prepare(run, back, out, log, until=until), damage


def attach(run: Run, cluster: node_wait.Cluster, out: TextIO) -> None:
    """make ray-job, before verl: the nodes the recipe needs (waited for up to launch.ray.node_wait_s) and, on
    more than one node, a checkpoint folder every node shares (tools/launch/shared_storage.py)."""
    out.write(f"make ray-job: verl's driver attaches to the Ray cluster at {cluster.address}\n")
    out.flush()
    cluster.ready()
    if cluster.nodes > 1:
        from tools.launch import shared_storage  # ray: only for a job of several nodes

        shared_storage.check(run.checkpoints, cluster.nodes,
                             lambda marker: shared_storage.ray_reader(marker, cluster.address))  # fmt: skip


# the variables that move the recipes' own asset caches out of the checkout (recipes/model/tiny-deepseek-v3.yaml,
# tiny-learn.yaml, tiny-zero.yaml): assets there are make train's to make, as in build/
CACHE_VARIABLES = ("ASCEND_R1_TINY", "ASCEND_R1_LEARN", "ASCEND_R1_ZERO")


def make_assets(run: Run, start: int, steps: int, log: Any) -> None:
    """The tiny model, tokenizer, data and Megatron checkpoint of a recipe whose files live in this checkout
    (or in a cache folder one of CACHE_VARIABLES names); never files a user pointed the recipe at."""
    launch = run.launch
    homes = [str(REPO), *(os.environ[v] for v in CACHE_VARIABLES if os.environ.get(v))]
    if not (
        "paths" in launch
        and "hf_model" in launch.paths
        and any(str(launch.paths.root).startswith(h) for h in homes)
    ):
        return
    made = assets.Assets.from_launch(launch)
    assets.make_data(made, log)  # first, and cheap: the step check below reads it
    preflight.batches(run, start, steps)  # before minutes of base-model making
    mcore = OmegaConf.select(run.cfg, "verl.actor_rollout_ref.actor.megatron.use_dist_checkpointing")
    assets.ensure(made, mcore=bool(mcore), log=log)


def start_verl(run: Run, out: TextIO) -> tuple[int, list[tuple[int, dict[str, float]]], dict[str, Any], int]:
    """verl, started again while Ray's start-up timed out and nothing of verl ran; the attempt's number."""
    attempt = 1 + len(list(run.folder.glob("verl-metrics-*.jsonl")))
    tries_left = RAY_START_TRIES - 1
    while True:
        environ = run.environ(attempt)
        rc, records, timeline = run_verl(
            run.command(attempt), environ, run.folder, attempt, out, watchdog.settings(run.launch)
        )
        # a run stopped by Ctrl-C or SIGTERM (130, 143) is not tried again, whatever the log says
        timed_out = not records and tries_left and ray_start_timed_out(run.folder / "verl.log")
        if rc in (0, 130, 143) or not timed_out:
            return rc, records, timeline, attempt
        # Ray's node start waits a fixed 30 s for the raylet (ray/_private/node.py): on a loaded machine it
        # can miss that; nothing of verl ran yet, so start it again
        out.write("Ray did not come up within its 30 s start-up limit (a loaded machine?): trying again\n")
        attempt, tries_left = attempt + 1, tries_left - 1


def outcome(
    run: Run,
    rc: int,
    records: list,
    timeline: dict[str, Any],
    attempt: int,
    out: TextIO,
    unlogged: Sequence[int] = (),
    fault: restart.Fault | None = None,
    why: str | None = None,
) -> int:
    """A failed or stopped verl said in words (exit 2, 3 or 130/143); a finished run's report and last lines.
    `unlogged`: steps trained and saved that verl never logged (live.add_unlogged); `fault` and `why`: the
    cause of a failure (tools/launch/restart.py) and why it was not restarted (again)."""
    verl_log, dry = run.folder / "verl.log", f"`make dry-run RECIPE={run.recipe}` shows the exact command"
    again = (
        f"make ray-job RECIPE={run.recipe} HEAD={run.ray_address}"
        if run.ray_address
        else f"make train RECIPE={run.recipe}"
    )
    if fault is not None and fault.recoverable:  # the machine's or a process's fault: exit 3, not 2
        out.write(f"no restart: {why}\n")
        stacks_dir = run.folder / f"stacks-{attempt}"
        raise MachineFault(
            f"the run failed: {fault.kind} at step {fault.step} (first error: {fault.process}: {fault.line}); every process"
            f" of it was stopped and no restart was made ({why}). Run folder {run.folder}",
            fix=f"read {verl_log}" + (f" and the stack dumps in {stacks_dir}" if fault.kind == "stall" else "")
            + f"; `{again}` resumes from the last sealed checkpoint"
            + ("" if run.launch.get("restarts", 0) else "; ARGS='launch.restarts=N' restarts by itself"),
        )  # fmt: skip
    if rc == EXIT_FAILED and "failure" in timeline:
        f = timeline["failure"]
        stacks_dir = run.folder / f"stacks-{attempt}"
        raise TrainError(
            f"the run {f['kind']}" + (f": {f['process']}: {f['first_error']}" if f["first_error"] else "")
            + f"; every process of it was stopped. Run folder {run.folder}",
            fix=f"read {verl_log}" + (f" and the stack dumps in {stacks_dir}" if f["kind"] == "stalled" else "")
            + f"; {dry}",
        )  # fmt: skip
    if rc in (130, 143):
        out.write(
            f"stopped at {len([r for r in records if live.is_train_step(r[1])]) + len(unlogged)} steps; "
            f"run folder {run.folder}\n"
        )
        return rc
    if rc != 0:
        tail = verl_log.read_text(errors="replace").splitlines()[-30:]
        first = timeline.get("first_error")
        raise TrainError(
            f"verl exited with status {rc}" + (f"; first error: {first['process']}: {first['line']}" if first else "")
            + f"; the last lines of {verl_log}:\n  " + "\n  ".join(tail),
            fix=f"read {verl_log}; {dry}",
        )  # fmt: skip
    if not any(live.is_train_step(d) for _, d in records):
        raise TrainError(f"verl exited without training a step (see {verl_log})")
    if "learning" in run.launch:
        final_eval.run_final_eval(run.folder, run.cfg, run.saved_step(), out)
        learning.conclude(run.folder, run.cfg, live.learn_key(run), out)
    out.write("".join(line + "\n" for line in finish(run.folder)))  # the report page and the closing lines
    return 0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--profile", default=None, help="cpu|npu|cuda (detected when left out)")
    ap.add_argument("--recipe", default=None, help="a recipes/*.yaml name (make recipes)")
    ap.add_argument("--backend", choices=["megatron", "fsdp"], default=None)
    ap.add_argument("--run", default=None, help="run folder name under outputs/ (default: the recipe's name)")
    ap.add_argument("--fresh", action="store_true", help="do not resume: start again (old checkpoints kept)")
    ap.add_argument("--resume-from", type=int, default=None, metavar="N",
                    help="resume from checkpoints/global_step_N (verified)")  # fmt: skip
    ap.add_argument("--dry-run", action="store_true", help="print the resolved config and the verl command")
    ap.add_argument("--no-plan", action="store_true", help="skip the preflight planner (make plan)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the recipe, e.g. launch.steps=5")


def main(argv: list[str] | None = None) -> int:
    """The same as `python -m tools.launch train ...` (make train)."""
    ap = argparse.ArgumentParser(prog="make train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add_arguments(ap)
    return train(ap.parse_args(argv))


if __name__ == "__main__":
    run_cli(main)
