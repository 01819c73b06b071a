"""A stop is a stop: Ctrl-C (SIGINT) or SIGTERM sent to `make train` while the run is in a given
moment ends every process of the run before it writes another file, and the records agree afterwards.

The moment is injected (tests/faults/sitecustomize.py, ASCEND_R1_FAULT=stop:<moment>): verl's trainer marks
when it enters the moment and holds there HOLD_S s before going on; the test then signals the launcher, as
a user or a cluster scheduler would. The moments:
- validation: validation before training, of a fresh run; SIGTERM (outside CI for its time:
  ASCEND_R1_ALL_TESTS=1, tests/outside_ci.py);
- update: the actor update of step 2 of a fresh run that saves every step (step 1's checkpoint is on disk);
- generation: the rollout of step 2 of a run resumed from that checkpoint; Ctrl-C twice, 0.3 s apart, as
  an impatient user does;
- save: step 2's checkpoint save of a resumed run, cut after the actor's files are written and before
  verl's tracker file: the cut save has no manifest, the launcher says it is incomplete, and the next
  `make train` resumes from step 1 and says so;
- in separate_async (docs/async.md): the update of step 2, the rollout generating in its own process (Ctrl-C;
  outside CI for its time), and the weight sync after step 1 (SIGTERM), which verl runs after step 1's save
  and before it logs step 1's metrics: the launcher keeps the sealed checkpoint and records step 1 as trained
  and unlogged.
(Start-up: tests/current/test_train_e2e.py::test_ctrl_c_leaves_nothing.) Each stop must:
- end `make train` within EXIT_S s of the signal, with 130 (SIGINT) or 143 (SIGTERM) and its stop lines;
- leave no process of the run;
- write no file of verl's (checkpoints, verl-metrics) later than FREEZE_S s after the signal (HOLD_S is
  longer: a run that went on would write past it), and no file at all once `make train` has exited;
- leave records that agree: metrics.jsonl and steps.md have the steps up to the latest sealed, intact
  checkpoint, and the tracker file names it.

The fresh run stopped in its update is made once (a module fixture) and copied for each resumed moment: 3
runs of `make train` in CI and one in `mode=separate_async` (the weight sync; ASCEND_R1_ALL_TESTS=1 adds the
validation stop and the separate_async update), each stopped 50-85 s after verl starts (the separate_async ones
120-200 s after `make train`).

The weight-sync stop, measured 2026-11-28 (same machine, load 2-3): 205 s; make train exited 1.7 s after the
signal. Without the unlogged-step record (at 82925c4) its records disagreed: "metrics.jsonl has steps [], the
checkpoint is 1".

Measured 2026-11-26 on a 2-core share of an AMD Zen (avx2 avx512f avx512_bf16, no AMX; load 4-6):
- with the fix: the 4 tests in 292-311 s (the fixture 82-92 s, validation 60-62 s, generation 71-80 s, save
  80-82 s); every run's processes (20) frozen and killed 0.3-0.7 s after verl marked the moment, make train
  exited 0.4-1.1 s after the signal.
- without it, at 9ff02a2 (before supervise's _OnSignal): test_stop_in_generation_of_a_resumed_run failed:
  the second Ctrl-C raised `Stop: SIGINT` out of procs.freeze_and_kill's wait: a traceback, exit 1, no
  records written.
- the launcher of 965e09a (before the checkpoint manifests and the freeze; this module's stop_at run
  against that checkout): on this stack it let verl shut itself down (exit 130, no process left, no file of
  verl's written after the signal; the issue's actors that trained on were not reproduced here), but its records fail check_records (a fresh run stopped in step 2's update: metrics.jsonl has
  step 1, no sealed checkpoint), and stopped in step 1's save it says nothing of the cut save (the
  "its save did not finish" line that test_stop_in_a_checkpoint_save asks for is absent). Stopped in
  validation before training (SIGINT) it passed every other check. Each of its stops exited 4.8-6.4 s after
  the signal (validation 4.9 s, update 5.2 s and 6.4 s (HOLD_S 15), save 4.8 s), past EXIT_S: the run went on for
  those seconds (here held in the injected moment; in the issue it trained two more steps and saved).
"""

from __future__ import annotations

import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import train_e2e as e2e
from tests.outside_ci import outside_ci
from tools.launch import checkpoints, resume

pytestmark = [pytest.mark.slow, pytest.mark.upstream, pytest.mark.megatron]
STACK = "current"
# the injected moment lasts HOLD_S, then verl goes on (were it not stopped): shorter than verl's own
# shutdown on Ctrl-C (6.4 s measured), so that a launcher that waits for it lets verl write on
HOLD_S = 4
STOP_S = 60  # past this after the signal, make train is killed and the test fails
# make train has stopped the run and exited within this of the signal (measured: 0.4-1.1 s; 965e09a's
# launcher, which waited for verl's own shutdown, 4.8-6.4 s: verl ran on meanwhile, and wrote, in the issue)
EXIT_S = 3.0
FREEZE_S = 3  # no file of verl's is written later than this after the signal (measured: 0.3-0.7 s)
SETTLE_S = 5  # after make train exited, nothing changes in the run folder for this long
START_S = 900  # the moment comes within this of the start (a loaded CI machine)
# 3 steps, a checkpoint each (the stops come in step 2), no validation before training unless asked
RUN = (
    "launch.steps=3",
    "verl.trainer.total_epochs=20",
    "verl.trainer.save_freq=1",
    "verl.trainer.val_before_train=false",
)
# what the launcher itself writes once verl is stopped (the records, its log, the manifests it seals)
LAUNCHER_FILES = {
    "metrics.jsonl", "metrics.jsonl.dropped", "steps.md", "reward.png", "response_length.png",
    "timeline.json", "verl.log", checkpoints.MANIFEST,
}  # fmt: skip


@dataclass
class Stopped:
    run: Path  # the run folder
    rc: int
    out: str  # make train's output
    signalled: float  # when the (first) signal was sent
    exited: float  # when make train exited
    left: list[tuple[int, str]]  # processes of the run still alive after it exited
    at_exit: dict[str, tuple[int, int]]  # run folder: path -> (mtime_ns, size), right after the exit
    settled: dict[str, tuple[int, int]]  # the same, SETTLE_S later


def _files(run: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for p in run.rglob("*"):
        if p.is_file():
            st = p.stat()
            out[p.relative_to(run).as_posix()] = (st.st_mtime_ns, st.st_size)
    return out


def stop_at(outputs: Path, moment: str, sig: signal.Signals, *args: str, call: int = 1, twice: bool = False):
    """`make train` (RUN, then `args`) into `outputs`, signalled with `sig` (`twice`: again 0.3 s later) once
    verl is in `moment` (its `call`-th time there)."""
    marks = outputs.parent / f"marks-{moment}"
    env = e2e.fault_env(
        marks,
        ASCEND_R1_FAULT=f"stop:{moment}",
        ASCEND_R1_FAULT_CALL=str(call),
        ASCEND_R1_FAULT_HOLD_S=str(HOLD_S),
    )
    run = e2e.Run(STACK, outputs, env, *args, base=RUN)
    deadline = time.time() + START_S
    while not e2e.fault_marks(marks):
        if run.proc.poll() is not None or time.time() > deadline:
            e2e.stop_run(run.proc)
            pytest.fail(f"verl never reached {moment} (call {call}):\n" + run.text()[-4000:])
        time.sleep(0.1)
    signalled = time.time()
    run.proc.send_signal(sig)
    if twice:
        time.sleep(0.3)
        run.proc.send_signal(sig)
    rc, exited, out = run.finish(timeout=STOP_S)
    folder = outputs / STACK / "tiny-cpu"
    at_exit = _files(folder)
    time.sleep(SETTLE_S)
    print(f"\n{moment}: {sig.name} {run.proc.pid} -> exit {rc} {exited - signalled:.1f} s later")
    return Stopped(folder, rc, out, signalled, exited, run.left_behind(), at_exit, _files(folder))


def check_stopped(s: Stopped, sig: signal.Signals) -> None:
    """What every stop must do (module docstring)."""
    took = s.exited - s.signalled
    assert s.rc == 128 + sig, f"exit status {s.rc}\n" + s.out[-4000:]
    assert took <= EXIT_S, f"make train exited {took:.1f} s after {sig.name}\n" + s.out[-2000:]
    assert f"{sig.name}: stopping verl and Ray" in s.out and "stopped: no verl or Ray process left" in s.out
    assert "Traceback" not in s.out, s.out[-4000:]
    assert not s.left, f"left running after make train exited: {s.left}"
    late = {
        path: (m / 1e9 - s.signalled)
        for path, (m, _) in s.settled.items()
        if m / 1e9 > s.signalled + FREEZE_S and Path(path).name not in LAUNCHER_FILES
    }
    assert not late, f"verl wrote after the stop ({sig.name}; s after it): {late}"
    changed = sorted(set(s.at_exit.items()) ^ set(s.settled.items()))
    assert not changed, f"the run folder changed after make train exited: {changed}"


def check_records(run: Path) -> tuple[list[int], int]:
    """metrics.jsonl, steps.md, the tracker and the sealed checkpoints describe the same steps: (the
    trained steps, the latest sealed and intact checkpoint's step, 0 if none)."""
    rows = e2e.metrics(run) if (run / "metrics.jsonl").exists() else []
    trained = [r["step"] for r in rows if r["kind"] == "train"]
    lines = (run / "steps.md").read_text().splitlines()[2:] if (run / "steps.md").exists() else []
    table = [line for line in lines if line.startswith("|")]  # the notes under it: steps never logged
    assert [int(line.split("|")[1]) for line in table] == trained, (table, trained)
    ckpt = run / "checkpoints"
    sealed = [n for n, d in checkpoints.step_dirs(ckpt).items() if checkpoints.read_manifest(d) is not None]
    for n in sealed:
        assert not checkpoints.verify(ckpt / f"global_step_{n}"), n
    latest = max(sealed, default=0)
    assert checkpoints.tracked_step(ckpt) == (latest or None), (checkpoints.tracked_step(ckpt), sealed)
    assert max(trained, default=0) == latest, f"metrics.jsonl has steps {trained}, the checkpoint is {latest}"
    return trained, latest


@pytest.fixture(scope="module")
def stopped_in_update(tmp_path_factory: pytest.TempPathFactory) -> Stopped:
    """A fresh run Ctrl-C'd in step 2's actor update: step 1 trained and saved."""
    outputs = tmp_path_factory.mktemp("update") / "outputs"
    return stop_at(outputs, "update", signal.SIGINT, call=2)


def _resumed(base: Stopped, tmp_path: Path) -> Path:
    """A copy of the run stopped in its update, to resume from its step 1."""
    outputs = tmp_path / "outputs"
    shutil.copytree(base.run.parents[1], outputs, symlinks=True)
    return outputs


@outside_ci("SIGTERM is the weight-sync stop's signal, and a stop in verl's generation is the resumed run's")
def test_stop_in_validation(tmp_path: Path) -> None:
    s = stop_at(tmp_path / "outputs", "validation", signal.SIGTERM, "verl.trainer.val_before_train=true")
    check_stopped(s, signal.SIGTERM)
    assert check_records(s.run) == ([], 0)
    assert not checkpoints.step_dirs(s.run / "checkpoints")


def test_stop_in_update(stopped_in_update: Stopped) -> None:
    s = stopped_in_update
    check_stopped(s, signal.SIGINT)
    assert check_records(s.run) == ([1], 1)
    assert "checkpoint global_step_1: manifest of" in s.out
    assert list(checkpoints.step_dirs(s.run / "checkpoints")) == [1]


def test_stop_in_generation_of_a_resumed_run(stopped_in_update: Stopped, tmp_path: Path) -> None:
    s = stop_at(_resumed(stopped_in_update, tmp_path), "generation", signal.SIGINT, twice=True)
    check_stopped(s, signal.SIGINT)
    assert "checkpoint global_step_1: verified against its manifest" in s.out
    assert "resuming from the checkpoint" in s.out and "global_step_1" in s.out
    assert check_records(s.run) == ([1], 1)
    assert list(checkpoints.step_dirs(s.run / "checkpoints")) == [1]


def test_stop_in_a_checkpoint_save(stopped_in_update: Stopped, tmp_path: Path) -> None:
    s = stop_at(_resumed(stopped_in_update, tmp_path), "save", signal.SIGINT)
    check_stopped(s, signal.SIGINT)
    ckpt = s.run / "checkpoints"
    cut = ckpt / "global_step_2"
    assert cut.is_dir() and any(cut.rglob("*")), "the save was not in flight: nothing of step 2 written"
    assert checkpoints.read_manifest(cut) is None, "a cut save was sealed"
    assert "checkpoint global_step_2: its save did not finish (verl's tracker says 1)" in s.out, s.out[-3000:]
    assert check_records(s.run) == ([1], 1)
    # the next make train resumes from step 1, and says why not from step 2 (its own first steps, in process)
    said: list[str] = []
    step = resume.prepare(
        s.run, fresh=False, resume_from=None, recipe="tiny-cpu", stack=STACK, overrides=[], log=said.append
    )
    assert step == 1, said
    assert any("global_step_2: its save did not finish" in line and "not used" in line for line in said), said
    assert any("global_step_1: verified against its manifest" in line for line in said), said
    assert not cut.exists() and checkpoints.tracked_step(ckpt) == 1


@outside_ci(
    "the weight-sync stop is a separate_async stop with both sides' processes running, and Ctrl-C in an update "
    "is the sync run's"
)
def test_stop_in_the_update_of_a_separate_async_run(tmp_path: Path) -> None:
    """separate_async (docs/async.md): the rollout generates the next batch in its own process while the
    trainer updates. A Ctrl-C in step 2's update, with that generation in flight, is a stop as in sync: every
    process (the standalone vLLM server and the detached actor included) gone, nothing written after it, and
    the records agreeing on step 1."""
    s = stop_at(tmp_path / "outputs", "update", signal.SIGINT, "mode=separate_async", call=2)
    assert "mode separate_async" in s.out, s.out[-3000:]
    check_stopped(s, signal.SIGINT)
    assert check_records(s.run) == ([1], 1)


def test_stop_in_the_weight_sync_of_a_separate_async_run(tmp_path: Path) -> None:
    """separate_async's weight sync after step 1 (the actor sending a bucket over the project's gloo engine,
    the rollout's receivers waiting in the collective). verl saved step 1 before the sync and logs its metrics
    after it: a SIGTERM there (a cluster scheduler's stop) is a stop, no process of either side left, nothing written after it, step 1's
    checkpoint sealed and kept, and the records agreeing with it: step 1 trained, its metrics never logged
    (before the fix: metrics.jsonl had no step and the checkpoint was step 1). The next make train resumes
    after step 1."""
    s = stop_at(tmp_path / "outputs", "sync", signal.SIGTERM, "mode=separate_async", call=2)
    check_stopped(s, signal.SIGTERM)
    assert check_records(s.run) == ([1], 1)
    assert "step 1: trained and saved, but the run ended before verl logged the step's metrics" in s.out
    assert "stopped at 1 steps" in s.out, s.out[-2000:]
    said: list[str] = []
    step = resume.prepare(
        s.run, fresh=False, resume_from=None, recipe="tiny-cpu", stack=STACK, overrides=[], log=said.append
    )
    assert step == 1, said
    assert any("global_step_1: verified against its manifest" in line for line in said), said
