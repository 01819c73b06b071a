"""tools/launch/supervise.py run_verl with a stand-in for verl (a Python script printing what verl's driver
prints): progress lines while a stage lasts, and the watchdog ending a run that failed or stalled, with
every process it started stopped. The real runs: tests/current/test_faults_e2e.py."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tools.launch import supervise

# a "driver" that starts a child (as verl starts Ray), prints verl's start-up line, then what `body` does
DRIVER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write(str(child.pid))
print("ray init kwargs: {}", flush=True)
%s
time.sleep(600)
"""


def run(tmp_path: Path, body: str, watch_s: tuple[float, float], monkeypatch) -> tuple[int, str, dict, int]:
    monkeypatch.setattr(supervise, "TICK_S", 1.0)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER % body)
    out = io.StringIO()
    pidfile = tmp_path / "child.pid"
    rc, _, timeline = supervise.run_verl([str(script), str(pidfile)], {}, tmp_path, 1, out, watch_s)
    return rc, out.getvalue(), timeline, int(pidfile.read_text())


def test_a_quiet_stage_gets_a_progress_line(tmp_path: Path, monkeypatch) -> None:
    rc, out, _, child = run(tmp_path, "time.sleep(2.5); sys.exit(0)", (60, 30), monkeypatch)
    assert "starting Ray and the verl workers" in out
    assert "  ... starting Ray (" in out, out


def test_an_error_with_no_progress_ends_the_run_and_its_processes(tmp_path: Path, monkeypatch) -> None:
    body = (
        'print("(vLLMHttpServer pid=7) Traceback (most recent call last):", flush=True)\n'
        'print("(vLLMHttpServer pid=7) AssertionError: Attempted to load weight", flush=True)'
    )
    start = time.monotonic()
    rc, out, timeline, child = run(tmp_path, body, (60, 2), monkeypatch)
    assert rc == supervise.EXIT_FAILED
    assert time.monotonic() - start < 15
    assert timeline["failure"]["process"] == "vLLMHttpServer pid=7"
    assert "AssertionError: Attempted to load weight" in out and str(tmp_path / "verl.log") in out
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_a_stall_dumps_each_process_and_ends_the_run(tmp_path: Path, monkeypatch) -> None:
    rc, out, timeline, child = run(tmp_path, "", (3, 30), monkeypatch)
    assert rc == supervise.EXIT_FAILED and timeline["failure"]["kind"] == "stalled"
    assert "the run stalled" in out and "where each process was (py-spy)" in out
    dumps = list((tmp_path / "stacks-1").glob("*.txt"))
    assert len(dumps) >= 2 and any("<module>" in p.read_text() for p in dumps), [p.read_text() for p in dumps]
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


@pytest.mark.skipif(sys.platform != "linux", reason="process sessions")
def test_the_run_ends_when_verl_exits(tmp_path: Path, monkeypatch) -> None:
    rc, out, timeline, _ = run(tmp_path, "sys.exit(3)", (60, 30), monkeypatch)
    assert rc == 3 and "failure" not in timeline


def test_a_verl_that_dies_of_an_error_has_it_named(tmp_path: Path, monkeypatch) -> None:
    body = (
        'print("(TaskRunner pid=5) Traceback (most recent call last):", flush=True)\n'
        'print("(TaskRunner pid=5) ray.exceptions.ActorDiedError: The actor died unexpectedly", flush=True)\n'
        "sys.exit(1)"
    )
    rc, out, timeline, _ = run(tmp_path, body, (60, 30), monkeypatch)
    assert rc == 1 and "failure" not in timeline
    assert timeline["first_error"] == {
        "process": "TaskRunner pid=5",
        "line": "ray.exceptions.ActorDiedError: The actor died unexpectedly",
    }


@pytest.mark.skipif(sys.platform != "linux", reason="process sessions")
def test_a_second_ctrl_c_while_stopping_does_not_cut_the_stop_short(tmp_path: Path, monkeypatch) -> None:
    """An impatient user's second Ctrl-C lands while the run is being frozen and killed: it is counted, not
    raised (before: a traceback out of the freeze, exit status 1, the run's records never written)."""
    real_kill_now = supervise.ProcessTree.kill_now

    def kill_now(self):
        os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C, inside the stop
        time.sleep(0.3)  # its handler runs here
        return real_kill_now(self)

    monkeypatch.setattr(supervise.ProcessTree, "kill_now", kill_now)
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT)).start()  # the first, while verl runs
    try:
        rc, out, _, child = run(tmp_path, "", (60, 30), monkeypatch)
    finally:
        signal.signal(signal.SIGINT, handlers[0])  # run_verl leaves its handler after a stop, until exit
        signal.signal(signal.SIGTERM, handlers[1])
    assert rc == 130, out
    assert "SIGINT: stopping verl and Ray" in out and "1 more stop signal(s) while stopping" in out, out
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
