"""One `make train` run, composed once: the recipe with its overrides for a stack into a resolved config,
the run folder, verl's command line and its environment. Every stage reads this value (assets, preflight
and planner, verl, metrics and the report); none composes the recipe again.

    run = Run.compose("tiny-cpu", ["launch.steps=5"], outputs=Path("outputs"))
    run = run.resumed(start=3, steps=5)   # verl's view: checkpoints folder, last step, resume mode
    run.argv, run.environ(attempt=1)
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from omegaconf import DictConfig, OmegaConf

from tools import stacks
from tools.errors import UserError
from tools.launch import checkpoints
from tools.recipes import recipe as R

REPO = Path(__file__).resolve().parents[2]
OUTPUTS = Path(os.environ.get("ASCEND_R1_OUTPUTS", REPO / "outputs"))  # tests point it elsewhere
DEFAULT_RECIPE = {"cpu": "tiny-cpu"}


class TrainError(UserError):
    """`make train` cannot start or did not finish; the message says why and what to do."""


# environment variables that hold a list of paths: the recipe's entries join the user's
PATH_LISTS = ("PYTHONPATH",)


@dataclass(frozen=True)
class Run:
    recipe: str
    overrides: tuple[str, ...]  # the user's Hydra overrides of the recipe
    stack: str
    profile: str
    cfg: DictConfig  # the recipe composed with the overrides, resolved (and once resumed: verl's resume keys)
    folder: Path  # outputs/<stack>/<run>
    named: bool = False  # the folder's name given (--run) rather than the recipe's
    fresh: bool = False  # --fresh: no resume
    start: int = 0  # the checkpoint step verl resumes from (0: the first step); set by resumed()
    argv: tuple[str, ...] = ()  # verl's command line after the interpreter; set by resumed()
    env: Mapping[str, str] = field(default_factory=dict)  # what verl's environment adds; set by resumed()
    ray_address: str | None = (
        None  # the Ray cluster verl's driver attaches to (make ray-job); None: its own Ray
    )

    @classmethod
    def compose(
        cls,
        recipe: str | None,
        overrides: list[str] | tuple[str, ...],
        *,
        outputs: Path = OUTPUTS,
        profile: str | None = None,
        backend: str | None = None,
        name: str | None = None,
        fresh: bool = False,
    ) -> Run:
        """The recipe (the profile's default when None; its `-<backend>` variant for another backend),
        composed once with the overrides."""
        profile = profile or stacks.detect_profile()
        chosen = pick_recipe(recipe, backend, profile)
        cfg = R.compose(chosen, list(overrides))
        stack = stacks.resolve().name
        folder = Path(outputs) / stack / (name or chosen)
        return cls(chosen, tuple(overrides), stack, profile, cfg, folder, name is not None, fresh)

    @property
    def launch(self) -> Any:
        return self.cfg.launch

    @property
    def on_cpu(self) -> bool:
        return self.cfg.launch.get("device") == "cpu"

    @property
    def checkpoints(self) -> Path:
        return self.folder / "checkpoints"

    @property
    def user_args(self) -> list[str]:
        """The ARGS a user gave `make train` for this run (a resume hint repeats them)."""
        return [*([f"--run={self.folder.name}"] if self.named else []), *self.overrides]

    def resumed(self, start: int, steps: int) -> Run:
        """The run as verl starts it: its checkpoint folder, last step, resume mode and experiment name set
        in (a copy of) the config, and the verl command line and environment made from that."""
        cfg = copy.deepcopy(self.cfg)
        keys = {
            "default_local_dir": str(self.checkpoints),
            "total_training_steps": start + steps,
            "resume_mode": "disable" if self.fresh else "auto",
            "experiment_name": self.folder.name,
        }
        if cfg.launch.get(
            "validation_generations"
        ):  # every validation response, <run>/validation/<step>.jsonl
            keys["validation_data_dir"] = str(self.folder / "validation")
        for key, value in keys.items():
            OmegaConf.update(cfg, f"verl.trainer.{key}", value, force_add=True)
        # recorded as the overrides they are (config.yaml, the report's "what ran")
        cfg.launch.overrides = [*cfg.launch.overrides, *(f"++verl.trainer.{k}={v}" for k, v in keys.items())]
        argv = R.verl_argv(cfg)
        env = {
            **R.verl_env(cfg),
            "PYTHONUNBUFFERED": "1",
            "RAY_DEDUP_LOGS": "0",
        }  # every step line in the log
        if self.ray_address:
            # a driver attaching to a running cluster must not size it (ray.init refuses num_cpus then)
            argv.append("++ray_kwargs.ray_init.num_cpus=null")
        elif cfg.launch.get("device") == "cpu":
            # the local Ray that verl starts: no dashboard (about 1 GiB of processes), no prestarted idle
            # workers; verl's config has no such keys, so they are added (++)
            argv.append("++ray_kwargs.ray_init.include_dashboard=false")
            # always a Ray of its own: ray.init() would otherwise join a cluster that `ray start` left on
            # this machine (/tmp/ray/ray_current_cluster) and refuse num_cpus
            argv.append("++ray_kwargs.ray_init.address=local")
        return replace(self, cfg=cfg, start=start, argv=tuple(argv), env=env)

    def environ(self, attempt: int) -> dict[str, str]:
        """verl's whole environment for an attempt: the launcher's, the recipe's, its own metrics file."""
        env = {**os.environ, **self.env}
        for key in PATH_LISTS:  # the recipe adds to the user's list (theirs first), never replaces it
            if os.environ.get(key) and self.env.get(key):
                env[key] = os.pathsep.join([os.environ[key], self.env[key]])
        env["VERL_FILE_LOGGER_PATH"] = str(self.folder / f"verl-metrics-{attempt}.jsonl")
        if (
            self.ray_address
        ):  # make ray-job: verl's driver attaches to the cluster (tools/cluster/ray_cluster.py)
            env["RAY_ADDRESS"] = self.ray_address
            env.setdefault("RAY_AUTH_MODE", "disabled")  # as the cluster's nodes run (ray_cluster.ray_env)
        else:
            env.pop("RAY_ADDRESS", None)  # verl starts its own local Ray
        if self.on_cpu:  # the user's setting wins
            env.setdefault("RAY_prestart_worker_first_driver", "0")
            env.setdefault("RAY_enable_worker_prestart", "0")
        return env

    def command(self, attempt: int) -> list[str]:
        """verl's command line for an attempt. On a cluster the workers do not inherit the driver's environment
        (the nodes' raylets were started before it): the run's own, with this attempt's metrics file, is the
        job's runtime environment (verl merges ray_kwargs.ray_init.runtime_env into its own)."""
        if not self.ray_address:
            return list(self.argv)
        env = {**self.env, "VERL_FILE_LOGGER_PATH": str(self.folder / f"verl-metrics-{attempt}.jsonl")}
        return [*self.argv, f"++ray_kwargs.ray_init.runtime_env={R.hydra_value({'env_vars': env})}"]

    def dry_run(self, out: TextIO) -> int:
        """Print the fully resolved recipe and the exact verl command; start nothing."""
        R.compose_verl(self.cfg)  # verl's own Hydra must accept every key, or this raises naming it
        out.write(
            f"# recipe {self.recipe}" + (f" with {' '.join(self.overrides)}" if self.overrides else "") + "\n"
        )
        out.write("# resolved config (launch: launcher only; verl: passed to verl)\n")
        out.write(OmegaConf.to_yaml(self.cfg))
        out.write("# the verl command (nothing was started)\n")
        out.write(R.shell_command(self.cfg, python="python") + "\n")
        return 0

    def saved_step(self) -> int:
        """The step of the latest complete checkpoint verl saved (0 when none)."""
        step = checkpoints.tracked_step(self.checkpoints) or 0
        return step if (self.checkpoints / f"global_step_{step}").is_dir() else 0


def pick_recipe(recipe: str | None, backend: str | None, profile: str) -> str:
    name = recipe or DEFAULT_RECIPE.get(profile)
    if name is None:
        raise TrainError(
            f"no default recipe for the {profile} profile yet",
            fix="name one: make train RECIPE=<name>   (make recipes lists them)",
        )
    # a look-up of the recipe's backend (unresolved, no overrides), only when BACKEND= is given
    if backend is None or R.compose(name, resolve=False).launch.backend == backend:
        return name
    alt = f"{name}-{backend}"
    if alt in {n for n, _ in R.list_recipes()}:
        return alt
    raise TrainError(
        f"recipe {name} does not use backend {backend}, and there is no recipe {alt}",
        fix=f"write recipes/{alt}.yaml, or leave BACKEND out",
    )


@contextlib.contextmanager
def checkout_lock(lock: Path, folder: Path) -> Iterator[None]:
    """One `make train` per checkout. The lock is released by the kernel if this process dies."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
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
        os.pwrite(fd, f"pid {os.getpid()}, run folder {folder}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)
