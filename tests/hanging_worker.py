"""A grading worker for tests: an answer starting "HANG" blocks SIGALRM and sleeps, which is what a grader
stuck inside C code looks like to the time limit. Everything else is graded normally."""

from __future__ import annotations

import signal
import time

from tools.reward import worker
from tools.reward.grade import Verdict, grade_timed


def _grade(answer: str | None, truth: str, seconds: float | None) -> Verdict:
    if answer is not None and answer.startswith("HANG"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(3600)
    return grade_timed(answer, truth, seconds)


worker.grade_timed = _grade  # serve() looks it up at call time

if __name__ == "__main__":
    worker.main()
