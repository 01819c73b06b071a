"""`make train` returns only once every process of the run is gone (tools/launch/process_tree.py stop()).

The issue: a Ray worker SIGKILLed after step 1, verl's driver exits by itself, and once in four tries 13
Ray/vLLM processes were still alive when `make train` exited. Two ways a process escaped the stop, each
reproduced here with plain processes in a session of their own (as supervise.run_verl starts verl):
- it was never sampled: it started after the sampler's last look (0.5 s apart) and its parent died, so it
  is neither in `seen` nor a descendant of the root; only the session holds it;
- it was started during the stop (a raylet replacing the workers it is told to lose): the stop looked once.
And the sampler thread no longer writes `seen` while the stop reads it (the sampler is joined first and
the tree is locked), which could raise "dictionary changed size during iteration" out of the stop.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil

from tools.launch.process_tree import ProcessTree


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for(path: Path, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            time.sleep(0.05)
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def test_a_process_never_sampled_whose_parent_died_is_stopped(tmp_path):
    """Root starts a middle process that starts a sleeper and exits (the sleeper is re-parented out of the
    tree); then the root exits. The sampler never saw the sleeper."""
    pidfile = tmp_path / "sleeper.pid"
    script = textwrap.dedent(f"""
        import subprocess, sys, time
        mid = subprocess.Popen([sys.executable, "-c",
            "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']);"
            "open({str(pidfile)!r}, 'w').write(str(p.pid))"])
        mid.wait()
        time.sleep(0.3)
    """)
    root = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    tree = ProcessTree(root.pid)  # sampled once, before any child exists
    tree.sample()
    sleeper = int(wait_for(pidfile))
    root.wait(timeout=20)
    assert alive(sleeper) and sleeper not in tree.seen
    try:
        stopped = tree.stop(grace=5)
        assert not alive(sleeper), "a process of the run's session, never sampled, outlived the stop"
        assert sleeper in stopped
    finally:
        if alive(sleeper):
            os.kill(sleeper, 9)


def test_a_process_started_during_the_stop_is_stopped(tmp_path):
    """A 'raylet' that, told to stop, first starts a replacement worker (in the run's session), then exits."""
    pidfile = tmp_path / "replacement.pid"
    script = textwrap.dedent(f"""
        import signal, subprocess, sys, time
        def on_term(*_):
            p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            open({str(pidfile)!r}, "w").write(str(p.pid))
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        open({str(tmp_path / "ready")!r}, "w").write("1")
        while True:
            time.sleep(0.1)
    """)
    root = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    wait_for(tmp_path / "ready")
    tree = ProcessTree(root.pid)
    tree.sample()
    replacement = None
    try:
        tree.stop(grace=5)
        root.wait(timeout=10)
        replacement = int(wait_for(pidfile))
        assert not alive(replacement), "a process started while the run was being stopped outlived the stop"
    finally:
        if replacement and alive(replacement):
            os.kill(replacement, 9)
        if root.poll() is None:
            root.kill()


def test_stop_while_the_sampler_adds_processes():
    """alive() and stop() read `seen` while a sampler thread writes it: no 'dictionary changed size'."""
    root = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    tree = ProcessTree(root.pid)
    done = threading.Event()
    errors: list[BaseException] = []

    tree.seen.update({pid: 0.0 for pid in range(10**7, 10**7 + 2000)})  # pids no process has
    lock = getattr(tree, "_lock", contextlib.nullcontext())

    def writer():  # as sample() does while processes come and go
        while not done.is_set():
            with lock:
                tree.seen[1] = 0.0
            # each time.sleep(0) hands the GIL to the reader, with the extra pid in and then out: an unguarded
            # read sees the size change; and the reader's psutil calls no longer wait out the switch interval
            # behind a writer that never let go (147 s in CI before)
            time.sleep(0)
            with lock:
                del tree.seen[1]
            time.sleep(0)

    th = threading.Thread(target=writer)
    th.start()
    try:
        for _ in range(20):
            try:
                tree.alive()
            except RuntimeError as e:  # dictionary changed size during iteration
                errors.append(e)
                break
    finally:
        done.set()
        th.join()
        root.kill()
        root.wait()
    assert not errors, errors
