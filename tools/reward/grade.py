"""Is this answer equal to the ground truth? Two graders in a chain, a fast path in front, a time limit.

- `grade_full`: mathruler first (cheap, strict); where it says no, math-verify (slower, knows more forms,
  e.g. an unreduced fraction against its reduced form). This is the reference verdict.
- `grade_fast`: answers only the cases whose verdict under `grade_full` is certain without sympy:
  equal after mathruler's own first normalisation (mathruler then says yes), or two different plain
  integers (both graders then say no). Everything else returns None and goes to `grade_full`.
- `time_limit`: a SIGALRM-based limit for pure-Python hangs (sympy). Work stuck inside C code (a huge
  integer power) ignores signals; `tools.reward.pool` kills such a worker from outside.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from math_verify import parse as mv_parse
from math_verify import verify as mv_verify
from mathruler.grader import grade_answer as mr_grade_answer
from mathruler.math_normalize import normalize_answer as mr_normalize

# we run math-verify without its own signal timeouts (they would cancel ours); it warns once about that
logging.getLogger("math_verify").setLevel(logging.ERROR)

_PLAIN_INT = re.compile(r"-?\d{1,12}")


@dataclass(frozen=True)
class Verdict:
    correct: bool
    by: str  # fast_equal | fast_int | mathruler | math_verify | timeout | no_answer


class GradeTimeout(BaseException):
    """Raised inside `time_limit` when the limit passes. A BaseException, so that the graders' own
    `except Exception` cannot swallow it (mathruler's bare `except:` can: see `time_limit`)."""


class _Alarm:
    fired = False


def _on_alarm(signum: int, frame: object) -> None:
    _Alarm.fired = True
    raise GradeTimeout


@contextmanager
def time_limit(seconds: float | None) -> Iterator[type[_Alarm]]:
    """Raise GradeTimeout in the block after `seconds`, and again every 50 ms until the block is left:
    a grader that swallows one (a bare `except:`) gets the next. `.fired` tells afterwards whether the
    limit passed, whatever the grader returned. Main thread only; elsewhere no limit applies."""
    _Alarm.fired = False
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield _Alarm
        return
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.05)
    try:
        yield _Alarm
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def mathruler_says(answer: str, ground_truth: str) -> bool:
    try:
        return bool(mr_grade_answer(answer, ground_truth))
    except GradeTimeout:
        raise
    except Exception:
        return False


def math_verify_says(answer: str, ground_truth: str) -> bool:
    # both sides as boxed LaTeX so math-verify extracts exactly the expression, not a number from prose
    try:
        gold = mv_parse(f"\\boxed{{{ground_truth}}}", parsing_timeout=None)
        pred = mv_parse(f"\\boxed{{{answer}}}", parsing_timeout=None)
        if not gold or not pred:
            return False
        return bool(mv_verify(gold, pred, timeout_seconds=None))
    except GradeTimeout:
        raise
    except Exception:
        return False


def grade_full(answer: str | None, ground_truth: str) -> Verdict:
    """The reference verdict: mathruler, then math-verify where mathruler says no. No cache, no fast path."""
    if answer is None:
        return Verdict(False, "no_answer")
    if mathruler_says(answer, ground_truth):
        return Verdict(True, "mathruler")
    return Verdict(math_verify_says(answer, ground_truth), "math_verify")


def grade_fast(answer: str | None, ground_truth: str) -> Verdict | None:
    """The verdict of `grade_full` when it is certain without sympy, else None."""
    if answer is None:
        return Verdict(False, "no_answer")
    if answer == ground_truth:
        return Verdict(True, "fast_equal")
    a, g = mr_normalize(answer), mr_normalize(ground_truth)
    if a == g:  # mathruler's first test: it would say yes
        return Verdict(True, "fast_equal")
    if (
        a is not None
        and g is not None
        and _PLAIN_INT.fullmatch(a)
        and _PLAIN_INT.fullmatch(g)
        and int(a) != int(g)
    ):
        return Verdict(False, "fast_int")
    return None


def grade_timed(answer: str | None, ground_truth: str, seconds: float | None) -> Verdict:
    """`grade_full` under `time_limit`; a timeout is a wrong answer with by="timeout"."""
    try:
        with time_limit(seconds) as alarm:
            v = grade_full(answer, ground_truth)
    except GradeTimeout:
        return Verdict(False, "timeout")
    return Verdict(False, "timeout") if alarm.fired else v
