"""tests/train_e2e.py's stop_run: what a timed-out `make train` test leaves behind is nothing, even a
process that ignores Ctrl-C and one that left the tree (as Ray's daemons do)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from tests.train_e2e import stop_run

# a launcher that ignores Ctrl-C, with a child that ignores it too and a grandchild whose parent exits
# (re-parented away from the launcher's tree, still in its process group)
LAUNCHER = """
import signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
stubborn = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)"
child = subprocess.Popen([sys.executable, "-c", stubborn])
orphan = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
    f"p = subprocess.Popen([sys.executable, '-c', {stubborn!r}]); print(p.pid, flush=True)"],
    stdout=subprocess.PIPE, text=True)
print(child.pid, orphan.stdout.readline().strip(), flush=True)
time.sleep(600)
"""


def test_stop_run_leaves_no_process_of_the_run():
    proc = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    pids = [proc.pid, *map(int, proc.stdout.readline().split())]
    time.sleep(0.5)
    assert all(psutil.pid_exists(p) for p in pids)
    stop_run(proc, ctrl_c_s=1)
    time.sleep(0.2)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running: {alive}"
