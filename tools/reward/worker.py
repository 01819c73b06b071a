"""Grading worker processes, started by `tools.reward.pool`.

    python -m tools.reward.worker FD SECONDS           # one worker: imports and warms up, then grades
    python -m tools.reward.worker FD SECONDS zygote    # a fork server: imports and warms up once, then
                                                       # forks a ready worker for every socket sent to it

A worker reads (key, answer, ground_truth) from its socket and answers (key, correct, by). The pool
starts one fresh interpreter (safe in threaded parents such as Ray workers, and never a re-import of the
parent's __main__): the zygote. It is single-threaded, so its forks are safe, and a fork is ready in
milliseconds, where a fresh interpreter takes 2-3 s (10 s on a loaded machine) to import sympy and
math-verify and warm them up. That matters when a worker is killed for an answer stuck in C code: the
replacement must not hold the batch.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import sys
from multiprocessing.connection import Connection

from tools.reward.grade import grade_timed, warm_up

PID = struct.Struct("<q")


def serve(conn: Connection, seconds: float | None, warm: bool = True) -> None:
    if warm:
        warm_up()
    conn.send("ready")
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        key, answer, truth = msg
        v = grade_timed(answer, truth, seconds)
        conn.send((key, v.correct, v.by))


def zygote(ctl: socket.socket, seconds: float | None) -> None:
    """Warm up once; then for each socket received on `ctl`, fork a worker serving it and send its pid."""
    warm_up()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the workers: no zombies
    ctl.sendall(b"R")
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 1, 1)
        except OSError:
            return
        if not msg or not fds:
            return
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                ctl.close()
                serve(Connection(fds[0]), seconds, warm=False)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(fds[0])
        ctl.sendall(PID.pack(pid))


def main() -> None:
    fd, seconds = int(sys.argv[1]), float(sys.argv[2])
    limit = seconds if seconds > 0 else None
    if sys.argv[3:] == ["zygote"]:
        zygote(socket.socket(fileno=fd), limit)
    else:
        serve(Connection(fd), limit)


if __name__ == "__main__":
    main()
