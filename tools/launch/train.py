"""`make train`: run GRPO through the patched verl for a recipe, and report it.

    make train                          # the embedded default: recipe tiny-cpu (Megatron actor) on this machine
    make train BACKEND=fsdp             # the same run with verl's FSDP2 actor (recipe tiny-cpu-fsdp)
    make train RECIPE=<name> ARGS='verl.data.train_batch_size=8 launch.steps=5'

What it does: composes the recipe (tools/launch/recipe.py), makes the tiny model, tokenizer, data and
Megatron checkpoint when the recipe uses them and they are missing (tools/launch/assets.py), starts
verl's `main_ppo` (which starts a local Ray), shows one table row per GRPO step, and writes the run folder

    outputs/<stack>/<run>/  config.yaml  command.txt  verl.log  metrics.jsonl  steps.md  reward.png
                    response_length.png  timeline.json  checkpoints/  verl-metrics-<attempt>.jsonl

Validation runs before training and at the end; a checkpoint is saved at the end and the next
`make train` of the same run resumes from it (training `launch.steps` more steps). Ctrl-C or SIGTERM
stops verl and every process it started (Ray included). A second `make train` in the same checkout
while one runs refuses, naming the run folder.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from tools import atomic, cpu_kernels, stacks
from tools.errors import UserError, run_cli
from tools.launch import checkpoints, resume, watchdog
from tools.launch.console import COLUMNS, derived, is_train_step
from tools.launch.report.runs import responses_per_step
from tools.launch.supervise import (
    EXIT_FAILED,
    RAY_START_TRIES,
    ray_start_timed_out,
    run_verl,
)
from tools.reward import tally
from tools.stacks import detect_profile

REPO = Path(__file__).resolve().parents[2]
OUTPUTS = Path(os.environ.get("ASCEND_R1_OUTPUTS", REPO / "outputs"))  # tests point it elsewhere
LOCK = OUTPUTS / ".train.lock"
DEFAULT_RECIPE = {"cpu": "tiny-cpu"}


class TrainError(UserError):
    """`make train` cannot start or did not finish; the message says why and what to do."""


# ---- metrics ---------------------------------------------------------------------------------------


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    return rows


def reward_tally(
    run: Path, attempt: int, cfg: Any, records: list[tuple[int, dict[str, float]]]
) -> dict[int, dict[str, float]]:
    """step -> reward/format, reward/accuracy, reward/timeouts (answers the grader cut off at its time limit
    or the batch's deadline, a count) and reward/seconds of this attempt's training steps: the reward
    function's tally (tools/reward/tally.py), which verl does not log for training steps."""
    path = tally.path_for(run / f"verl-metrics-{attempt}.jsonl")
    trained = [s for s, d in records if is_train_step(d)]
    if path is None or not path.is_file() or not trained:
        return {}
    return tally.per_step(tally.read(path), responses_per_step(cfg), min(trained))


def merge_metrics(
    run: Path,
    attempt: int,
    records: list[tuple[int, dict[str, float]]],
    reward: dict[int, dict[str, float]] | None = None,
) -> list[dict]:
    """metrics.jsonl: one record per training step over every attempt (a resumed run replaces the
    steps it trains again), with `reward` (reward_tally) in its step's metrics, plus validation records
    ("kind": "validation")."""
    path = run / "metrics.jsonl"
    old = read_jsonl(path)
    new = []
    for step, data in records:
        # verl logs the end-of-training validation in the same line as the last step's metrics
        val = {k: v for k, v in data.items() if k.startswith("val-")}
        rest = {k: v for k, v in data.items() if not k.startswith("val-")}
        if val:
            new.append({"step": step, "kind": "validation", "attempt": attempt, "metrics": val})
        if is_train_step(rest):
            m = {**derived(rest), **(reward or {}).get(step, {})}
            new.append({"step": step, "kind": "train", "attempt": attempt, "metrics": m})
    redone = {(r["step"], r["kind"]) for r in new}
    merged = [r for r in old if (r["step"], r["kind"]) not in redone] + new
    merged.sort(key=lambda r: (r["step"], r["kind"] != "validation"))
    atomic.write_bytes(path, "".join(json.dumps(r) + "\n" for r in merged).encode())
    return merged


def write_steps_table(run: Path, merged: list[dict]) -> None:
    heads = [h for h, _, _ in COLUMNS]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in merged:
        if r["kind"] != "train":
            continue
        m = r["metrics"]
        cells = [str(r["step"])] + [
            "-" if m.get(k) is None else f"{m[k]:.4g}" for _, k, _ in COLUMNS[1:]
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    atomic.write_bytes(run / "steps.md", ("\n".join(lines) + "\n").encode())


def plot(run: Path, merged: list[dict], wanted_key: str | None = None) -> list[Path]:
    """reward.png and response_length.png over the training steps (matplotlib, no display); with
    `wanted_key` (a recipe with launch.learning) also learning.png, the learning curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in merged if r["kind"] == "train"]
    steps = [r["step"] for r in train]
    out = []
    for name, key, label in (
        ("reward.png", "critic/rewards/mean", "reward mean"),
        ("response_length.png", "response_length/mean", "response length (tokens, mean)"),
    ):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(steps, [r["metrics"].get(key, math.nan) for r in train], marker="o")
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.set_title(f"{run.name}: {label}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        with atomic.atomic_path(run / name) as tmp:
            fig.savefig(tmp, format="png")
        plt.close(fig)
        out.append(run / name)
    from tools.launch import learning

    png = learning.plot(learning.run_curve(run, wanted_key), run.name) if wanted_key is not None else None
    if png:
        atomic.write_bytes(run / "learning.png", png)
        out.append(run / "learning.png")
    return out


# ---- the run folder, lock and resume ----------------------------------------------------------------


@contextlib.contextmanager
def checkout_lock(run: Path) -> Iterator[None]:
    """One `make train` per checkout. The lock is released by the kernel if this process dies."""
    OUTPUTS.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another make train"
            raise TrainError(
                f"another `make train` is running in this checkout: {holder}",
                fix="wait for it to finish, or stop it with Ctrl-C (or kill its pid with SIGTERM)",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, run folder {run}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)


def saved_step(ckpt_dir: Path) -> int:
    """The step of the latest complete checkpoint verl saved in ckpt_dir (0 when none)."""
    marker = ckpt_dir / "latest_checkpointed_iteration.txt"
    try:
        step = int(marker.read_text().strip())
    except (OSError, ValueError):
        return 0
    return step if (ckpt_dir / f"global_step_{step}").is_dir() else 0


# ---- the command -----------------------------------------------------------------------------------


def pick_recipe(recipe: str | None, backend: str | None, profile: str) -> str:
    from tools.launch.recipe import compose, list_recipes

    name = recipe or DEFAULT_RECIPE.get(profile)
    if name is None:
        raise TrainError(
            f"no default recipe for the {profile} profile yet",
            fix="name one: make train RECIPE=<name>   (make recipes lists them)",
        )
    if backend is None:
        return name
    if compose(name, resolve=False).launch.backend == backend:
        return name
    names = {n for n, _ in list_recipes()}
    alt = f"{name}-{backend}"
    if alt in names:
        return alt
    raise TrainError(
        f"recipe {name} does not use backend {backend}, and there is no recipe {alt}",
        fix=f"write recipes/{alt}.yaml, or leave BACKEND out",
    )


def preflight(cfg: Any, profile: str) -> None:
    """The stack's trees exist and carry their series (those this profile installs), before verl starts."""
    from tools.patches import manager
    from tools.patches.config import load_upstreams

    for up in load_upstreams(REPO).values():
        if profile not in up.install:
            continue
        st = manager.patch_status(up)
        if not st.ready:
            row = st.row()
            raise TrainError(
                f"{up.path} ({up.ref}) is not ready: sources {row['source']}, patches {row['patches']}",
                fix=f"make bootstrap STACK={up.stack}   (or make apply-patches STACK={up.stack} UP={up.name})",
            )
    # found, not imported: importing verl takes the launcher ~6-12 s (torch, tensordict, transformers) and
    # keeps ~0.5 GiB resident in it for the whole run, for nothing the launcher uses
    if importlib.util.find_spec("verl") is None:
        raise TrainError("verl is not installed in this environment", fix="make bootstrap")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="make train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--profile", default=None, help="cpu|npu|cuda (detected when left out)")
    ap.add_argument("--recipe", default=None, help="a recipes/*.yaml name (make recipes)")
    ap.add_argument("--backend", choices=["megatron", "fsdp"], default=None)
    ap.add_argument("--run", default=None, help="run folder name under outputs/ (default: the recipe's name)")
    ap.add_argument(
        "--fresh", action="store_true", help="do not resume: start again (the old checkpoints are kept)"
    )
    ap.add_argument(
        "--resume-from",
        type=int,
        default=None,
        metavar="N",
        help="resume from checkpoints/global_step_N (verified)",
    )
    ap.add_argument(
        "--dry-run", action="store_true", help="print the resolved config and the verl command; start nothing"
    )
    ap.add_argument("--no-plan", action="store_true", help="skip the preflight planner (make plan)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the recipe, e.g. launch.steps=5")
    a = ap.parse_args(argv)
    out = sys.stdout
    t0 = time.time()

    from omegaconf import OmegaConf

    from tools.launch import assets as assets_mod
    from tools.launch.plan.batch import launch_steps
    from tools.launch.recipe import compose, verl_argv, verl_env

    profile = a.profile or detect_profile()
    recipe = pick_recipe(a.recipe, a.backend, profile)
    if a.dry_run:
        from tools.launch.__main__ import dry_run

        return dry_run(recipe, a.overrides)
    cfg = compose(recipe, a.overrides)
    stack = stacks.resolve()
    run = OUTPUTS / stack.name / (a.run or recipe)
    with checkout_lock(run):
        preflight(cfg, profile)
        run.mkdir(parents=True, exist_ok=True)
        out.write(
            f"make train: stack {stack.name}, recipe {recipe} (backend {cfg.launch.backend}, {cfg.launch.device});"
            f" run folder {run}\n"
        )
        if cfg.launch.get("device") == "cpu":
            rollout = OmegaConf.select(cfg, "verl.actor_rollout_ref.rollout.name", default="?")
            out.write(cpu_kernels.describe(cfg.launch.get("cpu_kernels", "native"), rollout) + "\n")
        ckpt = run / "checkpoints"
        steps = launch_steps(cfg)  # a whole number >= 1, else refused naming launch.steps
        log = lambda m: (out.write(m + "\n"), out.flush())  # noqa: E731
        start = resume.prepare(  # verified against its manifest; later checkpoints and records set aside
            run, fresh=a.fresh, resume_from=a.resume_from, recipe=recipe, stack=stack.name,
            overrides=[*([f"--run={a.run}"] if a.run else []), *a.overrides], log=log,
            redraw=lambda kept: (write_steps_table(run, kept), plot(run, kept)),
        )  # fmt: skip
        if (
            "paths" in cfg.launch
            and "hf_model" in cfg.launch.paths
            and str(cfg.launch.paths.root).startswith(str(REPO))
        ):
            made = assets_mod.Assets.from_launch(cfg.launch)
            assets_mod.make_data(made, log)  # first, and cheap: the step check below reads it
            check_batches(cfg, recipe, a.overrides, start, steps)  # before minutes of base-model making
            assets_mod.ensure(
                made,
                mcore=bool(
                    OmegaConf.select(cfg, "verl.actor_rollout_ref.actor.megatron.use_dist_checkpointing")
                ),
                log=log,
            )
        if not a.no_plan:
            preflight_plan(recipe, a.overrides, out)
        check_batches(cfg, recipe, a.overrides, start, steps)
        extra = [
            f"++verl.trainer.default_local_dir={ckpt}",
            f"++verl.trainer.total_training_steps={start + steps}",
            f"++verl.trainer.resume_mode={'disable' if a.fresh else 'auto'}",
            f"++verl.trainer.experiment_name={run.name}",
        ]
        if start:
            out.write(
                f"resuming from the checkpoint {ckpt}/global_step_{start}: training steps {start + 1}..{start + steps}\n"
            )
        cfg = compose(recipe, [*a.overrides, *extra])
        attempt = 1 + len(list(run.glob("verl-metrics-*.jsonl")))
        env = {**os.environ, **verl_env(cfg)}
        env["VERL_FILE_LOGGER_PATH"] = str(run / f"verl-metrics-{attempt}.jsonl")
        env.pop("RAY_ADDRESS", None)  # verl starts its own local Ray
        env["PYTHONUNBUFFERED"] = "1"
        env["RAY_DEDUP_LOGS"] = "0"  # every step line reaches the log
        argv_v = verl_argv(cfg)
        if cfg.launch.get("device") == "cpu":
            # the local Ray that verl starts: no dashboard (about 1 GiB of processes), no prestarted
            # idle workers; verl's config has no such keys, so they are added (++)
            argv_v.append("++ray_kwargs.ray_init.include_dashboard=false")
            # always a Ray of its own: ray.init() would otherwise join a cluster that `ray start` left on
            # this machine (/tmp/ray/ray_current_cluster) and refuse num_cpus
            argv_v.append("++ray_kwargs.ray_init.address=local")
            env.setdefault("RAY_prestart_worker_first_driver", "0")
            env.setdefault("RAY_enable_worker_prestart", "0")
        atomic.write_bytes(run / "config.yaml", OmegaConf.to_yaml(cfg).encode())
        atomic.write_bytes(run / "command.txt", (" ".join([sys.executable, *argv_v]) + "\n").encode())
        for tries_left in range(RAY_START_TRIES - 1, -1, -1):
            rc, records, timeline = run_verl(argv_v, env, run, attempt, out, watchdog.settings(cfg.launch))
            stopped = rc in (130, 143)  # Ctrl-C or SIGTERM: not tried again, whatever the log says
            if rc == 0 or stopped or records or not tries_left or not ray_start_timed_out(run / "verl.log"):
                break
            # Ray's node start waits a fixed 30 s for the raylet (ray/_private/node.py): on a loaded
            # machine it can miss that; nothing of verl ran yet, so start it again
            out.write(
                "Ray did not come up within its 30 s start-up limit (a loaded machine?): trying again\n"
            )
            attempt += 1
            env["VERL_FILE_LOGGER_PATH"] = str(run / f"verl-metrics-{attempt}.jsonl")
        checkpoints.seal_new(ckpt, after=start, log=log)  # manifests for the checkpoints this run saved
        timeline["launcher_start_to_verl"] = 0.0
        timeline["resumed_from_step"] = start
        timeline["wall_s"] = time.time() - t0
        hist = json.loads((run / "timeline.json").read_text()) if (run / "timeline.json").exists() else {}
        hist[str(attempt)] = timeline
        atomic.write_json(run / "timeline.json", hist)
        merged = (
            merge_metrics(run, attempt, records, reward_tally(run, attempt, cfg, records))
            if records
            else read_jsonl(run / "metrics.jsonl")
        )
        learn_key = OmegaConf.select(cfg, "launch.learning.accuracy_key", default=None)
        if "base_model" in cfg.launch:
            base = Path(cfg.launch.paths.hf_model) / "base_model.json"
            if base.is_file():
                atomic.copy_file(base, run / "base_model.json")
        if merged:
            write_steps_table(run, merged)
            plot(run, merged, learn_key if "learning" in cfg.launch else None)
        if rc == EXIT_FAILED and "failure" in timeline:
            f = timeline["failure"]
            raise TrainError(
                f"the run {f['kind']}"
                + (f": {f['process']}: {f['first_error']}" if f["first_error"] else "")
                + f"; every process of it was stopped. Run folder {run}",
                fix=f"read {run / 'verl.log'}"
                + (f" and the stack dumps in {run / f'stacks-{attempt}'}" if f["kind"] == "stalled" else "")
                + f"; `make dry-run RECIPE={recipe}` shows the exact command",
            )
        if rc != 0:
            tail = (run / "verl.log").read_text(errors="replace").splitlines()[-30:]
            if rc in (130, 143):
                out.write(
                    f"stopped at {len([r for r in records if is_train_step(r[1])])} steps; run folder {run}\n"
                )
                return rc
            first = timeline.get("first_error")
            raise TrainError(
                f"verl exited with status {rc}"
                + (f"; first error: {first['process']}: {first['line']}" if first else "")
                + f"; the last lines of {run / 'verl.log'}:\n  "
                + "\n  ".join(tail),
                fix=f"read {run / 'verl.log'}; `make dry-run RECIPE={recipe}` shows the exact command",
            )
        trained = [s for s, d in records if is_train_step(d)]
        if not trained:
            raise TrainError(f"verl exited without training a step (see {run / 'verl.log'})")
        saved = saved_step(ckpt)
        if "learning" in cfg.launch:
            learned(run, cfg, saved, learn_key, out)
        from tools.launch.report import finish  # the run's report page and the lines that end the run

        out.write("".join(line + "\n" for line in finish(run)))
    return 0


def preflight_plan(recipe: str, overrides: list[str], out: TextIO) -> None:
    """`make plan` before anything starts: a failing rule stops the run with the planner's table."""
    from tools.launch.plan import FAIL, WARN, plan, render

    p = plan(recipe, overrides)
    if not p.ok:
        raise TrainError(
            "the preflight planner found problems; nothing was started:\n" + render(p),
            fix=f"fix the FAIL rows above (`make plan RECIPE={recipe}` shows them again)",
        )
    warnings = [r for r in p.results if r.status == WARN]
    out.write(
        f"preflight: {sum(r.status != FAIL for r in p.results)} rules checked, {len(warnings)} warnings"
        f" ({p.seconds:.1f} s; make plan RECIPE={recipe} for the table)\n"
    )
    for r in warnings:
        out.write(f"  WARN {r.rule}: {r.values}\n")


def learned(run: Path, cfg: Any, saved: int, key: str | None, out: TextIO) -> None:
    """A recipe that learns (launch.learning): the trained actor scored as the base model was (when
    launch.final_eval), the learning curve in one line, learning.png redrawn with the final figures."""
    from tools.launch import learning

    if cfg.launch.get("final_eval") and saved:
        t = time.time()
        out.write(
            f"final evaluation: exporting the actor of step {saved} and scoring it on the held-out problems ...\n"
        )
        out.flush()
        learning.final_eval(run, cfg, saved, log=lambda m: (out.write(m + "\n"), out.flush()))
        out.write(f"  ({time.time() - t:.0f} s)\n")
    c = learning.run_curve(run, key)
    png = learning.plot(c, run.name)
    if png:
        atomic.write_bytes(run / "learning.png", png)
    atomic.write_json(run / "learning.json", c.summary())
    out.write(
        f"learning: {learning.describe(c)}\nlearning curve: {run / 'learning.png'}, {run / 'learning.json'}\n"
    )


def check_batches(cfg: Any, recipe: str, overrides: list[str], start: int, steps: int) -> None:
    """Refuse more steps than the training data has batches for: verl would stop early, silently."""
    from tools.data.parquet import readable
    from tools.launch.plan.batch import data_batches, steps_fix, train_command
    from tools.launch.plan.context import check_integer

    v = cfg.verl
    train_files = v.data.get("train_files")
    if not train_files or not all(
        readable(f) for f in (train_files if not isinstance(train_files, str) else [train_files])
    ):
        return  # the planner reports missing or damaged data (tools.data.parquet)
    batch, epochs = (
        check_integer(x, low=1)
        for x in (v.data.get("gen_batch_size") or v.data.train_batch_size, v.trainer.get("total_epochs") or 1)
    )
    if not (isinstance(batch, int) and isinstance(epochs, int)):
        return  # the planner names the bad value
    b = data_batches(list(train_files) if not isinstance(train_files, str) else train_files, batch, epochs)
    if start + steps <= b.total:
        return
    asked = f"steps {start + 1}..{start + steps}" + (f" (resuming after step {start})" if start else "")
    raise TrainError(
        f"recipe {recipe} asks for {asked} but {b.describe()} (verl.data, verl.trainer.total_epochs)",
        fix=steps_fix(recipe, cfg.launch.stack, overrides, start + steps, b)
        + (
            f"; or start over: {train_command(recipe, cfg.launch.stack, ' '.join(['--fresh', *overrides]))}"
            if start
            else ""
        ),
    )


if __name__ == "__main__":
    run_cli(main)
