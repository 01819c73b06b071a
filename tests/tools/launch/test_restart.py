"""Restarts without a person (tools/launch/restart.py): what ended an attempt, whether a restart can help,
when a crash loop stops it; and the launcher's loop with a fake verl (tools/launch/train.py): a worker lost
after a checkpoint is restarted from it up to the same last step, recorded in metrics.jsonl; a user's error
is never retried; spent restarts end with exit 3 (tools.errors.MACHINE_FAULT), not 2."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tools.errors import MACHINE_FAULT, USER_ERROR, MachineFault, UserError, exit_status
from tools.launch import checkpoints, restart, train
from tools.launch.restart import Fault, Policy
from tools.miniature import assets
from tools.report import live

DIED = "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task."


def _fault(
    line: str, *, rc: int = 1, process: str = "TaskRunner pid=7", stalled: bool = False, step: int = 3
):
    tl: dict = {"first_error": {"process": process, "line": line}} if line else {}
    if stalled:
        tl["failure"] = {"kind": "stalled", "process": process, "first_error": line, "seconds": 300.0}
    return restart.classify(rc, tl, step)


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (DIED, "worker lost"),
        # Ray's line for any dead worker names the OOM killer among its "common causes": not an OOM
        ("A worker died or was killed while executing a task by an unexpected system error. ... Some common"
         " causes include: (1) the process was killed by the OOM killer due to high memory usage", "worker lost"),
        # verl's driver on a cluster whose node went away, before Ray marked the node dead
        ("ray.exceptions.ActorUnavailableError: The actor 48f5 is unavailable: The actor is temporarily unavailable:"
         " RpcError: RPC error: Socket closed rpc_code: 14.", "worker lost"),
        ("Task was killed due to the node running low on memory. Memory on the node was 30GB", "out of memory"),
        ("RuntimeError: [ERROR] HCCL function error: ..., error code is EI0006: get socket timeout", "collective timeout"),
        ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE)", "collective timeout"),
        ("torch.OutOfMemoryError: NPU out of memory. Tried to allocate 2.00 GiB", "out of memory"),
        ("ray.exceptions.NodeDiedError: node 10.0.0.2 has been marked dead", "node lost"),
        ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue", "engine error"),
        ("omegaconf.errors.ConfigAttributeError: Key 'foo' is not in struct", "config"),
        ("FileNotFoundError: [Errno 2] No such file or directory: '/data/train.parquet'", "data"),
        ("AssertionError: batch size must divide", "error"),
    ],
)  # fmt: skip
def test_each_cause_is_named_and_only_the_machines_are_recoverable(line: str, kind: str) -> None:
    f = _fault(line)
    assert f is not None and f.kind == kind
    assert f.recoverable == (kind not in ("config", "data", "error"))


def test_a_finished_or_stopped_run_has_no_fault_and_a_stall_or_a_signal_has_one() -> None:
    assert all(_fault(DIED, rc=rc) is None for rc in (0, 130, 143))
    assert _fault("", rc=3, stalled=True).kind == "stall"
    assert _fault("", rc=-9).kind == "worker lost"
    assert _fault("", rc=1).kind == "error"
    # an exception from vLLM's engine process is the engine's error, whatever it says
    assert _fault("RuntimeError: injected fault", process="vLLMHttpServer pid=3 / EngineCore pid=4").kind == (
        "engine error"
    )


RULES = Policy(limit=3, window_s=3600.0)


def test_a_recoverable_fault_is_restarted_until_the_limit_within_the_window() -> None:
    f = Fault("worker lost", "W pid=1", DIED, 3)
    assert restart.give_up(f, [], 2, 1000.0, RULES, [], last=10) is None
    assert restart.give_up(f, [], 2, 1000.0, RULES, [10.0, 20.0, 30.0], last=10).startswith(
        "launch.restarts is 3"
    )
    assert restart.give_up(f, [], 2, 9000.0, RULES, [10.0, 20.0, 30.0], last=10) is None  # outside the window
    assert "launch.restarts is 0" in restart.give_up(f, [], 2, 0.0, Policy(0, 3600.0), [], last=10)
    assert "not a fault" in restart.give_up(Fault("config", "x", "y", 3), [], 2, 0.0, RULES, [], last=10)
    assert "every step up to 10" in restart.give_up(
        Fault("stall", "x", "", 11), [], 2, 0.0, RULES, [], last=10
    )


def test_a_crash_loop_stops_with_one_line_saying_why() -> None:
    before = Fault("worker lost", "W pid=1", DIED, 3)
    # no new step since the last restart
    why = restart.give_up(Fault("stall", "W pid=2", "", 3), [(before, 2)], 0, 0.0, RULES, [0.0], last=10)
    assert (
        why
        == "a crash loop: no new step since the last restart (resumed from step 2, stall again before step 3 finished)"
    )
    # the same error (pids aside) twice at the same step, steps trained in between
    again = Fault("worker lost", "W pid=9", DIED, 3)
    why = restart.give_up(again, [(before, 1)], 1, 0.0, RULES, [0.0], last=10)
    assert why is not None and why.startswith("a crash loop: the same error twice at step 3")
    assert (
        restart.give_up(Fault("worker lost", "W", DIED, 5), [(before, 1)], 3, 0.0, RULES, [0.0], last=10)
        is None
    )


def test_bad_restart_settings_are_refused_naming_the_key() -> None:
    with pytest.raises(UserError, match="launch.restarts"):
        restart.policy(OmegaConf.create({"restarts": -1}))
    with pytest.raises(UserError, match="launch.restart_window_h"):
        restart.policy(OmegaConf.create({"restarts": 1, "restart_window_h": 0}))
    assert restart.policy(OmegaConf.create({})) == Policy(0, 24 * 3600.0)


def test_a_machine_fault_exits_3_and_a_user_error_2() -> None:
    def fault() -> int:
        raise MachineFault("worker lost", fix="make train")

    def mistake() -> int:
        raise UserError("bad key")

    assert exit_status(fault) == MACHINE_FAULT == 3
    assert exit_status(mistake) == USER_ERROR


def test_lost_work_counts_from_the_checkpoint_resumed_from() -> None:
    tl = {"start": 100.0, "steps": {"1": 40.0, "2": 60.0, "3": 80.0}, "end": 95.0}
    assert restart.lost_work(tl, 2, 3) == (1, 35.0)
    assert restart.lost_work(tl, 0, 3) == (3, 95.0)
    assert restart.first_step_after(tl) == 140.0 and restart.first_step_after({"start": 1.0}) is None


# the launcher's loop, with a fake verl ---------------------------------------------------------------------


def _save(ckpt: Path, step: int) -> None:
    d = ckpt / f"global_step_{step}"
    d.mkdir(parents=True)
    (d / "data.pt").write_bytes(b"loader" + bytes([step]))
    (ckpt / checkpoints.TRACKER).write_text(str(step))


@pytest.fixture
def fake(monkeypatch, tmp_path):
    monkeypatch.setattr(train, "OUTPUTS", tmp_path / "outputs")
    monkeypatch.setattr(train, "LOCK", tmp_path / "outputs" / ".train.lock")
    monkeypatch.setattr(train.preflight, "trees", lambda cfg, profile: None)
    monkeypatch.setattr(train.preflight, "batches", lambda *a, **k: None)
    monkeypatch.setattr(assets, "ensure", lambda *a, **k: None)
    monkeypatch.setattr(assets, "make_data", lambda *a, **k: None)
    monkeypatch.setattr(train, "outcome", _finished_or(train.outcome))
    return tmp_path / "outputs"


def _finished_or(real):
    def outcome(run, rc, records, timeline, attempt, out, unlogged=(), fault=None, why=None):
        if rc == 0:  # no report page from a fake run
            return 0
        return real(run, rc, records, timeline, attempt, out, unlogged, fault, why)

    return outcome


def _verl(script: list[tuple[int, list[int], str]], calls: list):
    """A verl that, attempt after attempt, trains `steps` (saving each), then exits `rc` with `line`."""

    def run_verl(argv, env, run, attempt, out, *watch):
        rc, steps, line = script[len(calls)]
        total = int(next(a.split("=")[1] for a in argv if "trainer.total_training_steps=" in a))
        calls.append((attempt, total))
        Path(env["VERL_FILE_LOGGER_PATH"]).write_text("")  # as verl's file logger does
        with open(run / "verl.log", "a") as log:
            log.write(f"\n==== attempt {attempt}\n{line}\n")
        records, tl = [], {"start": time.time(), "steps": {}, "end": 50.0}
        for s in steps:
            _save(run / "checkpoints", s)
            records.append((s, {"timing_s/step": 1.0}))
            tl["steps"][str(s)] = 10.0 * s
        if line:
            tl["first_error"] = {"process": "WorkerDict pid=5", "line": line}
        return rc, records, tl

    return run_verl


def _rows(outputs: Path) -> list[dict]:
    path = next(outputs.glob("*/tiny-cpu/metrics.jsonl"))
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_a_lost_worker_is_restarted_from_the_last_checkpoint_up_to_the_same_step(fake, monkeypatch, capsys):
    calls: list = []
    script = [(1, [1, 2], DIED), (0, [3, 4], "")]
    monkeypatch.setattr(train, "run_verl", _verl(script, calls))
    drawn: list = []  # the restarts drawn on the step plots
    real_lines = live.plots.lines
    monkeypatch.setattr(
        live.plots, "lines", lambda *a, **k: drawn.append(k.get("vlines")) or real_lines(*a, **k)
    )
    assert train.main(["--recipe", "tiny-cpu", "--no-plan", "launch.steps=4", "launch.restarts=1"]) == 0
    assert calls == [(1, 4), (2, 4)]  # the second attempt trains up to step 4 too, not 4 more
    said = capsys.readouterr().out
    assert "worker lost at step 3: restarting (1 of launch.restarts 1)" in said
    assert "resuming from the checkpoint of step 2, 0 step(s)" in said
    rows = _rows(fake)
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4]
    (r,) = [r for r in rows if r["kind"] == "restart"]
    assert (r["cause"], r["failed_at_step"], r["resumed_from"], r["lost_steps"]) == ("worker lost", 3, 2, 0)
    assert r["to_first_step_s"] is not None  # the next attempt's first step was seen
    assert drawn[-1] == [(2.5, "restart: worker lost in step 3, from 2")]


def test_a_users_error_is_not_retried_and_exits_2(fake, monkeypatch):
    calls: list = []
    script = [(1, [1], "omegaconf.errors.ConfigAttributeError: Key 'x' is not in struct")] * 2
    monkeypatch.setattr(train, "run_verl", _verl(script, calls))
    assert exit_status(train.main, ["--recipe", "tiny-cpu", "--no-plan", "launch.restarts=3"]) == USER_ERROR
    assert len(calls) == 1


def test_spent_restarts_end_with_exit_3_and_a_crash_loop_says_so(fake, monkeypatch, capsys):
    calls: list = []
    script = [(1, [1], DIED), (1, [], DIED)]
    monkeypatch.setattr(train, "run_verl", _verl(script, calls))
    rc = exit_status(train.main, ["--recipe", "tiny-cpu", "--no-plan", "launch.steps=3", "launch.restarts=3"])
    assert rc == MACHINE_FAULT and len(calls) == 2
    captured = capsys.readouterr()
    assert "no restart: a crash loop: no new step since the last restart (resumed from step 1" in captured.out
    assert "error: the run failed: worker lost at step 2" in captured.err


def _damage_after_seal(monkeypatch, step: int) -> None:
    """The storage loses part of checkpoint `step` after the launcher sealed it (before the restart)."""
    real = checkpoints.seal_new

    def seal_then_damage(ckpt: Path, after: int, log) -> list[int]:
        sealed = real(ckpt, after=after, log=log)
        if step in sealed:
            (ckpt / f"global_step_{step}" / "data.pt").write_bytes(b"x")
        return sealed

    monkeypatch.setattr(train.checkpoints, "seal_new", seal_then_damage)


def test_a_restart_falls_back_from_a_damaged_checkpoint_to_the_last_intact_one(fake, monkeypatch, capsys):
    calls: list = []
    monkeypatch.setattr(train, "run_verl", _verl([(1, [1, 2], DIED), (0, [2, 3, 4], "")], calls))
    _damage_after_seal(monkeypatch, 2)
    assert train.main(["--recipe", "tiny-cpu", "--no-plan", "launch.steps=4", "launch.restarts=1"]) == 0
    assert calls == [(1, 4), (2, 4)]
    said = capsys.readouterr().out
    assert "checkpoint global_step_2 is damaged (" in said and (
        "global_step_2/data.pt: truncated: 1 bytes, the manifest says 7): restarting from the last intact"
        " checkpoint, step 1 (global_step_2 is moved aside, kept)" in said
    )
    rows = _rows(fake)
    (r,) = [r for r in rows if r["kind"] == "restart"]
    assert (r["resumed_from"], r["damaged_step"], r["lost_steps"]) == (1, 2, 1)
    assert "global_step_2/data.pt: truncated" in r["damage"]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3, 4]
    assert list(fake.glob("*/tiny-cpu/checkpoints/dropped/*/global_step_2/data.pt"))  # kept, not deleted


def test_a_damaged_checkpoint_with_none_intact_before_it_is_the_users_to_fix(fake, monkeypatch, capsys):
    calls: list = []
    monkeypatch.setattr(train, "run_verl", _verl([(1, [1], DIED), (0, [1, 2], "")], calls))
    _damage_after_seal(monkeypatch, 1)
    rc = exit_status(train.main, ["--recipe", "tiny-cpu", "--no-plan", "launch.steps=2", "launch.restarts=1"])
    assert rc == USER_ERROR and len(calls) == 1
    err = capsys.readouterr().err
    assert "global_step_1 is damaged" in err and "fix: start over: make train" in err
