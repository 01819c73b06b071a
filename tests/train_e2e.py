"""What tests/<stack>/test_train_e2e.py share: `make train` run for a stack (`python -m tools.launch.train`
with ASCEND_R1_OUTPUTS and ASCEND_R1_STACK), its metrics, and the checks that hold on every stack: the
first run's outputs, the checkpoint exported to HF, the resume, and Ctrl-C leaving no process behind.
Each stack's test module keeps its own tests and what only that stack checks.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import psutil
import pytest
import torch
from omegaconf import OmegaConf

from tools.launch.procs import gone, terminate

REPO = Path(__file__).resolve().parents[1]
FAULTS = REPO / "tests" / "faults"  # sitecustomize.py: the faults injected into verl's processes
PNG = b"\x89PNG\r\n\x1a\n"
# mean |p_rollout - p_actor| per sampled token, each step (current, vLLM bf16 against the Megatron actor bf16 on
# the same weights; tiny-learn, 40 steps of seed 0: 6e-5 to 1.8e-3, mostly ~2e-4; the base model's own
# transformers fp32 against bf16: 9.7e-5; tiny-zero, 80 steps: 2e-5 to 2.6e-3, median 2e-4 to 3.5e-4)
HANDOVER_MEAN_TOL = 5e-3


def train(
    stack: str, outputs: Path, *args: str, timeout: int, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`make train` on `stack` with its run folders under `outputs` (and `env` set), to the end. Past
    `timeout` s the test fails, and the run is stopped as a user would (Ctrl-C), then every process it
    started is killed: Ray and vLLM must not outlive the test (they would hold gigabytes through the rest
    of the session)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.launch.train", *args],
        cwd=REPO, env={**_env(stack, outputs), **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group: whatever escapes the tree is still found
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        left = stop_run(proc)
        out, err = proc.communicate()
        pytest.fail(
            f"make train did not finish within {timeout} s; stopped it and {left} process(es) it had started\n"
            + out[-3000:]
            + err[-3000:]
        )
    finally:
        if proc.poll() is None:
            stop_run(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def stop_run(proc: subprocess.Popen, ctrl_c_s: float = 60) -> int:
    """Ctrl-C the launcher `proc` (started in its own session), give it `ctrl_c_s` to stop verl and Ray,
    then kill what is left of its process tree and process group. How many processes were left."""
    try:
        launcher = psutil.Process(proc.pid)
        tree = [launcher, *launcher.children(recursive=True)]
    except psutil.NoSuchProcess:  # the launcher has exited and been reaped: what it left is in its group
        tree = []
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(ctrl_c_s)
    left = terminate([p for p in tree if not gone(p)], grace=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # what left the tree (re-parented) is still in the group
    proc.wait()
    return len(left)


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def rollout_returns_log_probs(stack: str) -> bool:
    """Whether the stack's rollout engine returns its own log-probs in the recipes (the current stack's vLLM
    engine: recipes/for_stack/current/tiny-cpu.yaml sets `rollout.calculate_log_probs`; published's HF
    rollout has none)."""
    return stack == "current"


def check_rollout_follows_actor(
    run: Path, expected: bool, tol: float = HANDOVER_MEAN_TOL
) -> dict[int, float]:
    """Where the run's rollout returns its own log-probs (`rollout.calculate_log_probs`: the current stack's
    vLLM engine), verl's `training/rollout_probs_diff_mean` (mean |p_rollout - p_actor| over a step's sampled
    tokens, the actor on that step's weights) is below `tol` at every step: the engine samples from the
    actor's distribution, so each step's weight hand-over reached it. `expected`: whether this run's rollout
    must return them (`rollout_returns_log_probs`); a run that should and does not fails here instead of
    skipping the check. The figure per step (empty where the rollout returns no log-probs, as expected)."""
    train = {r["step"]: r["metrics"] for r in metrics(run) if r["kind"] == "train"}
    diff = {s: m.get("training/rollout_probs_diff_mean") for s, m in sorted(train.items())}
    print("rollout vs actor, mean |p| difference per step:", {s: f"{d:.1e}" for s, d in diff.items() if d})
    on = bool(OmegaConf.load(run / "config.yaml").verl.actor_rollout_ref.rollout.get("calculate_log_probs"))
    assert on == expected, (
        f"rollout.calculate_log_probs is {on} in {run / 'config.yaml'}, expected {expected}: the hand-over check "
        "needs the rollout's own log-probs where the stack's engine returns them"
    )
    if not on:
        return {}
    assert train and all(d is not None for d in diff.values()), diff  # the rollout returned its log-probs
    worst = max(diff, key=lambda s: diff[s])
    assert diff[worst] < tol, (
        f"the rollout engine does not sample from the actor's distribution: mean |p_rollout - p_actor| "
        f"{diff[worst]:.2e} at step {worst} (want < {tol:.0e} every step; the weight hand-over did not reach "
        f"the engine?); per step {diff}"
    )
    return diff


def check_first_run(first: subprocess.CompletedProcess, run: Path, finite: Iterable[str]) -> list[dict]:
    """The first run of the default recipe went through to `run`: the asked-for steps with the `finite`
    metrics finite, validation before training and at the end, the step table and the plots. Its train
    rows."""
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert f"run folder {run}" in first.stdout

    # metrics: the asked-for steps, finite losses, validation before training and at the end
    rows = metrics(run)
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == [1, 2, 3]
    for r in train_rows:
        for key in finite:
            assert math.isfinite(r["metrics"][key]), (r["step"], key)
    assert {r["step"] for r in rows if r["kind"] == "validation"} == {0, 3}
    table = (run / "steps.md").read_text().splitlines()
    assert table[0].startswith("| step | gen s | reshard s | reward s | old_lp s | ref s | update s")
    assert len(table) == 2 + 3

    # plots: non-empty PNGs
    for name in ("reward.png", "response_length.png"):
        data = (run / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 2000, name
    return train_rows


def check_exported_checkpoint(dist: Path, hf: Path, config: Path) -> None:
    """The actor's torch_dist checkpoint `dist`, exported by the project's mcore-to-hf (local layer spec
    names, `config`: the run's HF model) to `hf`, is a DeepSeek-V3 that transformers loads with every
    weight present, and runs."""
    exp = subprocess.run(
        [sys.executable, "-m", "tools.weights", "mcore-to-hf", str(dist), str(hf),
         "--config", str(config), "--layer-spec", "local", "--threads", "1"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert exp.returncode == 0, exp.stderr[-3000:]
    from transformers import DeepseekV3ForCausalLM

    model, info = DeepseekV3ForCausalLM.from_pretrained(hf, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[5, 6, 7, 8]])).logits).all()


def check_resumed(second: subprocess.CompletedProcess, run: Path) -> list[dict]:
    """A second `make train` of the run that saved step 3 resumed from it and went on to step 6; its train
    rows."""
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resuming from the checkpoint" in second.stdout and "global_step_3" in second.stdout
    train_rows = [r for r in metrics(run) if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4, 5, 6]
    assert (run / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "6"
    return train_rows


# a run Ctrl-C interrupts: with its bytecode cached the 3-step default run can end before the interrupt comes
LONG_RUN = ("launch.steps=200", "verl.trainer.total_epochs=20")


def check_ctrl_c_leaves_nothing(
    stack: str,
    outputs: Path,
    args: Sequence[str],
    *,
    start_s: float,
    settle_s: float,
    stop_s: float,
    when_started: Callable[[subprocess.Popen, float], None],
) -> None:
    """`make train` (`args`, asking for far more steps than the test waits for: the run is still going when
    Ctrl-C comes, however fast the machine) until it starts Ray (within `start_s`), then
    `when_started(proc, deadline)`, then `settle_s` recording its process tree (Ray and verl's workers), then
    Ctrl-C: it exits 130 within `stop_s`, saying it stops verl and Ray, and none of the processes it started
    is left."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.launch.train", *args, *LONG_RUN],
        cwd=REPO, env=_env(stack, outputs), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    seen: set[psutil.Process] = set()
    try:
        deadline = time.time() + start_s
        assert proc.stdout is not None
        for line in proc.stdout:
            if "starting Ray" in line:
                break
            assert time.time() < deadline, "verl did not start"
        when_started(proc, deadline)
        t_end = time.time() + settle_s
        while time.time() < t_end:
            try:
                seen.update(psutil.Process(proc.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                break
            time.sleep(0.5)
        assert len(seen) >= 4, "Ray and verl's workers should be running by now"
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=stop_s)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, rest[-3000:]
    assert "stopping verl and Ray" in rest
    alive = [p for p in seen if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [(p.pid, p.name()) for p in alive]


class Run:
    """`make train` on `stack` (by default the long run, LONG_RUN, then `args`) with extra `env` (a fault),
    its output read as it comes, and every process of it recorded."""

    def __init__(
        self, stack: str, outputs: Path, env: dict[str, str], *args: str, base: Sequence[str] = LONG_RUN
    ):
        full_env = {**_env(stack, outputs), **env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tools.launch.train", *base, *args],
            cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self.seen: set[psutil.Process] = set()
        self.done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._watch, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def _watch(self) -> None:
        while not self.done.is_set() and self.proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                self.seen.update(psutil.Process(self.proc.pid).children(recursive=True))
            time.sleep(0.5)

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.time() + timeout
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, "make train ended early:\n" + "".join(self.lines[-40:])
            assert time.time() < deadline, f"no {text!r} within {timeout} s:\n" + "".join(self.lines[-40:])
            time.sleep(0.5)

    def finish(self, timeout: float) -> tuple[int, float, str]:
        """(exit status, when it exited, its output); past `timeout` the test fails and the run is killed."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            left = stop_run(self.proc)
            pytest.fail(
                f"make train still ran {timeout} s after the fault (stopped it, {left} left)\n" + self.text()
            )
        finally:
            self.done.set()
        ended = time.time()
        time.sleep(1.0)
        return rc, ended, self.text()

    def text(self) -> str:
        return "".join(self.lines)

    def left_behind(self) -> list[tuple[int, str]]:
        return [(p.pid, p.name()) for p in self.seen if p.is_running() and not gone(p)]


def fault_env(marks: Path, **extra: str) -> dict[str, str]:
    """The environment of a run with tests/faults/sitecustomize.py loaded into every Python process of it,
    marking the fault's times in `marks`."""
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(FAULTS), os.environ.get("PYTHONPATH")])),
        "ASCEND_R1_FAULT_MARK": str(marks),
        **extra,
    }


def fault_marks(path: Path) -> list[float]:
    """The times a fault marked (the first field of each line of its ASCEND_R1_FAULT_MARK file)."""
    return [float(line.split()[0]) for line in path.read_text().splitlines()] if path.exists() else []


def _env(stack: str, outputs: Path) -> dict[str, str]:
    return {**os.environ, "ASCEND_R1_OUTPUTS": str(outputs), "ASCEND_R1_STACK": stack}
