"""`make train`'s front: DRY_RUN prints the exact verl command and starts nothing; the preflight planner
runs before verl and a failing rule stops the run; a Ray start that timed out under load is tried once
more, any other failure is not."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tools import stacks
from tools.launch import supervise, train
from tools.launch.train import REPO
from tools.miniature import assets


@pytest.fixture
def no_verl(monkeypatch, tmp_path):
    """Fail the test if verl would be started; outputs in a temporary folder."""

    def refuse(*args, **kwargs):
        raise AssertionError("verl was started")

    monkeypatch.setattr(train, "run_verl", refuse)
    monkeypatch.setattr(train, "OUTPUTS", tmp_path / "outputs")
    monkeypatch.setattr(train, "LOCK", tmp_path / "outputs" / ".train.lock")
    monkeypatch.setattr(train.preflight, "trees", lambda cfg, profile: None)


def test_dry_run_prints_the_verl_command_and_starts_nothing(no_verl, capsys):
    assert train.main(["--recipe", "deepseek-v3-671b-a3", "--dry-run", "verl.data.train_batch_size=256"]) == 0
    out = capsys.readouterr().out
    assert "python -m verl.trainer.main_ppo --config-name ppo_megatron_trainer" in out
    assert "data.train_batch_size=256" in out
    # the rollout's 128 data-parallel groups: verl 0.6's SPMD rollout reads VLLM_DP_SIZE (published);
    # verl 0.9's server mode takes rollout.data_parallel_size and refuses the variable (current)
    if stacks.resolve().name == "published":
        assert "VLLM_DP_SIZE=128" in out
    else:
        assert "actor_rollout_ref.rollout.data_parallel_size=128" in out and "VLLM_DP_SIZE" not in out


def test_a_failing_preflight_rule_stops_the_run_before_verl(no_verl, monkeypatch):
    monkeypatch.setattr(assets, "ensure", lambda *a, **k: None)
    monkeypatch.setattr(assets, "make_data", lambda *a, **k: None)
    with pytest.raises(train.TrainError) as e:
        train.main(["--recipe", "tiny-cpu", "verl.actor_rollout_ref.actor.ppo_mini_batch_size=3"])
    msg = str(e.value)
    assert "preflight planner found problems; nothing was started" in msg
    assert "mini-batch divides the batch" in msg and "make plan RECIPE=tiny-cpu" in msg


@pytest.mark.parametrize(
    ("message", "calls"),
    [(supervise.RAY_START_TIMEOUT, supervise.RAY_START_TRIES), ("ValueError: something else", 1)],
)
def test_a_ray_start_timeout_is_tried_again(no_verl, monkeypatch, capsys, message, calls):
    monkeypatch.setattr(assets, "ensure", lambda *a, **k: None)
    monkeypatch.setattr(assets, "make_data", lambda *a, **k: None)
    seen = []

    def failing(argv, env, run, attempt, out, *watch_s):
        seen.append((attempt, env["VERL_FILE_LOGGER_PATH"]))
        with open(run / "verl.log", "a") as f:
            f.write(f"\n==== attempt {attempt}: python -m verl\n  Exception: {message}\n")
        return 1, [], {"start": 0.0}

    monkeypatch.setattr(train, "run_verl", failing)
    with pytest.raises(train.TrainError, match="verl exited with status 1"):
        train.main(["--recipe", "tiny-cpu", "--no-plan"])
    assert [a for a, _ in seen] == list(range(1, calls + 1))
    assert len({p for _, p in seen}) == calls  # each attempt its own metrics file
    said = capsys.readouterr().out
    assert ("trying again" in said) == (calls > 1)


def test_ray_start_timeout_is_recognised_in_the_last_attempt_only(tmp_path):
    log = tmp_path / "verl.log"
    assert not supervise.ray_start_timed_out(log)
    log.write_text(
        "\n==== attempt 1: python -m verl.trainer.main_ppo\nException: The current node timed out during startup. "
        "This could happen because some of the raylet failed to startup\n"
    )
    assert supervise.ray_start_timed_out(log)
    log.write_text(log.read_text() + "\n==== attempt 2: python -m verl.trainer.main_ppo\nstep:1 - loss:0.1\n")
    assert not supervise.ray_start_timed_out(log)


def test_the_preflight_finds_verl_without_importing_it():
    """The launcher lives for the whole run: importing verl there cost ~6-12 s before verl started and kept
    ~0.5 GiB resident beside it (a fresh interpreter: this test process may have imported verl already)."""
    code = (
        "import sys\n"
        "from tools.launch import train\n"
        "from tools.recipes import recipe\n"
        "train.preflight.trees(recipe.compose('tiny-cpu'), 'cpu')\n"
        "print('verl imported' if 'verl' in sys.modules else 'verl not imported')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "verl not imported"


def test_a_cached_model_is_checked_without_importing_torch(tmp_path):
    """The launcher checks the tiny model's stamp before every run and then waits for verl: importing torch
    and transformers for that kept ~0.2 GiB of the process tree's memory for the whole run."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tools.miniature import assets\n"
        f"t = Path({str(tmp_path)!r})\n"
        "a = assets.Assets(t / 'hf', t / 'raw', t / 'data', t / 'mcore', {'num_hidden_layers': 1})\n"
        "made = assets.make_model(a, log=lambda m: None)\n"
        "print('made' if made else 'cached', 'torch' in sys.modules)\n"
    )
    run = lambda: subprocess.run(  # noqa: E731  (a fresh interpreter each time)
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    first = run()
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.split() == ["made", "True"]
    second = run()
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.stdout.split() == ["cached", "False"], "checking a cached model imported torch"


def test_a_cluster_recipe_on_a_cpu_machine_says_so_first(no_verl, tmp_path):
    """`make train RECIPE=deepseek-v3-671b-a3` on a CPU machine: what the recipe needs and how it is run,
    before any other check (it once said `launch.steps=None ...` first) and before a run folder is made."""
    with pytest.raises(train.TrainError) as e:
        train.main(["--recipe", "deepseek-v3-671b-a3", "--profile", "cpu"])
    msg = str(e.value)
    assert "is a cluster recipe" in msg and "256 NPU dies on 16 A3 nodes" in msg
    assert "launch.paths.mcore" in msg and "launch.paths.data" in msg and "this machine has no NPU" in msg
    for how in (
        "make prepare",
        "make ray-head",
        "make ray-job",
        "make slurm",
        "make kuberay",
        "make plan",
        "DRY_RUN=1",
    ):
        assert f"{how}" in msg, how
    assert "launch.steps" not in msg
    assert not (tmp_path / "outputs").exists()
    # a single-node NPU recipe says where it runs too
    with pytest.raises(train.TrainError, match=r"one a2-8 node: it trains on 8 NPU devices"):
        train.main(["--recipe", "qwen2.5-7b-a2", "--profile", "cpu"])


def test_the_steps_fix_works_as_written():
    """The fix printed for a recipe without launch.steps must compose as written (`launch.steps=5` once failed:
    `Could not override 'launch.steps'`, the key being absent from the 671B recipe)."""
    import re

    from tools.errors import UserError
    from tools.plan import launch_steps
    from tools.recipes import recipe as R

    with pytest.raises(UserError) as e:
        launch_steps(R.compose("deepseek-v3-671b-a3"))
    args = re.search(r"ARGS='([^']+)'", e.value.fix)
    assert args and "make train RECIPE=deepseek-v3-671b-a3" in e.value.fix, e.value.fix
    assert launch_steps(R.compose("deepseek-v3-671b-a3", args.group(1).split())) == 5
    stack = stacks.resolve().name
    for name, _ in R.list_recipes():  # every recipe of this stack takes the override
        if R.runs_on(name, stack):
            assert launch_steps(R.compose(name, ["launch.steps=2"])) == 2, name
