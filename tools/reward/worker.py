"""A grading worker process: `python -m tools.reward.worker FD SECONDS`, started by `tools.reward.pool`.

It reads (key, answer, ground_truth) from the socket FD and answers (key, correct, by). Started as a
fresh interpreter rather than forked: safe in threaded parents (Ray workers) and never re-imports the
parent's __main__.
"""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection

from tools.reward.grade import grade_timed, warm_up


def serve(conn: Connection, seconds: float | None) -> None:
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


def main() -> None:
    fd, seconds = int(sys.argv[1]), float(sys.argv[2])
    serve(Connection(fd), seconds if seconds > 0 else None)


if __name__ == "__main__":
    main()
