"""Is this answer equal to the ground truth? Two graders in a chain, a fast path in front, a time limit.

- `grade_full`: mathruler first (cheap, strict); where it says no, math-verify (slower, knows more forms,
  e.g. an unreduced fraction against its reduced form). This is the reference verdict.
- `grade_fast`: answers only the cases whose verdict under `grade_full` is certain without sympy:
  equal after mathruler's own first normalisation (mathruler then says yes), or two plain numbers
  (integers, decimals, fractions) compared exactly. Everything else returns None and goes to
  `grade_full`.
- `time_limit`: a SIGALRM-based limit that stops sympy and friends (slow simplifications, huge powers
  such as 10^{10^{10}}). Code that never returns to the interpreter (stuck in C) ignores signals;
  `tools.reward.pool` kills such a worker from outside.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction

from math_verify import parse as mv_parse
from math_verify import verify as mv_verify
from mathruler.grader import grade_answer as mr_grade_answer
from mathruler.math_normalize import normalize_answer as mr_normalize

from tools.reward.quick import clearly_different

# we run math-verify without its own signal timeouts (they would cancel ours); it warns once about that
logging.getLogger("math_verify").setLevel(logging.ERROR)

# a plain number after mathruler's normalisation (which already turned \dfrac, \frac12 and a/b into \frac{a}{b})
_NUMBER = re.compile(r"(-?)(?:(\d{1,12})(?:\.(\d{1,12}))?|\\frac\{(\d{1,12})\}\{(\d{1,12})\})")


@dataclass(frozen=True)
class Verdict:
    correct: bool
    by: str  # fast_equal | fast_number | fast_value | mathruler | math_verify | unit | timeout | no_answer


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
        while True:  # a re-armed alarm may land in here too: retry until the timer is really off
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
                break
            except GradeTimeout:
                continue


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


# a number, then a unit word bare or in \text{}/\mbox{}, with an optional square or cube: "864 inches^2",
# "15\mbox{ cm}^2" (MATH-500's answers write units so; mathruler drops only \text{} units, math-verify none)
_UNIT_WORD = (
    r"(?:square |sq\.? |cubic )?(?:mm|cm|km|m|in|inch|inches|ft|feet|foot|yd|yards?|miles?|meters?|"
    r"centimeters?|millimeters?|kilometers?|units?|degrees?|cents?|dollars?|hours?|minutes?|seconds?|days?|mph)"
)
_WITH_UNIT = re.compile(
    r"\s*(?P<number>-?\d[\d,]*(?:\.\d+)?|\\d?frac\{\d+\}\{\d+\})\s*(?:\\[,;! ])?\s*"
    r"(?:\\(?:text|mbox|mathrm)\{\s*(?P<boxed>" + _UNIT_WORD + r")\s*\}|(?P<bare>" + _UNIT_WORD + r"))"
    r"\s*(?P<power>\^\{?[23]\}?)?\s*"
)


def without_unit(text: str) -> tuple[str, str] | None:
    """(number, unit with its power) of an answer that is a plain number and a unit word, else None."""
    m = _WITH_UNIT.fullmatch(text)
    if m is None:
        return None
    unit = (m.group("boxed") or m.group("bare")) + (m.group("power") or "").replace("{", "").replace("}", "")
    return m.group("number").replace(",", ""), unit


def same_number_and_unit(answer: str, ground_truth: str) -> bool:
    """Both a number and a unit word (or the answer one and the gold a bare number): equal numbers and, where
    both name one, the same unit. What mathruler and math-verify miss: 864 inches^2 against 864\\mbox{ inches}^2."""
    a = without_unit(answer)
    if a is None:
        return False
    g = without_unit(ground_truth) or (ground_truth.strip(), a[1])
    if a[1] != g[1]:
        return False
    va, vg = plain_number(mr_normalize(a[0])), plain_number(mr_normalize(g[0]))
    return va is not None and va == vg


def grade_full(answer: str | None, ground_truth: str) -> Verdict:
    """The reference verdict: mathruler, then math-verify where mathruler says no, then a number with a unit
    word (`same_number_and_unit`) where both say no. No cache, no fast path."""
    if answer is None:
        return Verdict(False, "no_answer")
    if mathruler_says(answer, ground_truth):
        return Verdict(True, "mathruler")
    if math_verify_says(answer, ground_truth):
        return Verdict(True, "math_verify")
    if same_number_and_unit(answer, ground_truth):
        return Verdict(True, "unit")
    return Verdict(False, "math_verify")


_SPACED_DIGITS = re.compile(r"\d(?:\s|\\[,!;: ])+\d")


def plain_number(normalized: str | None) -> Fraction | None:
    """The exact value of an integer, decimal or \\frac{a}{b} literal (as mathruler normalises it), else None."""
    if normalized is None:
        return None
    m = _NUMBER.fullmatch(normalized)
    if m is None:
        return None
    sign, whole, decimals, num, den = m.groups()
    if whole is not None:
        value = Fraction(int(whole + (decimals or "")), 10 ** len(decimals or ""))
    elif int(den) == 0:
        return None
    else:
        value = Fraction(int(num), int(den))
    return -value if sign else value


def grade_fast(answer: str | None, ground_truth: str) -> Verdict | None:
    """The verdict of `grade_full` when it is certain without sympy, else None.

    - equal after mathruler's first normalisation: mathruler says yes;
    - both plain numbers (integer, decimal, fraction, at most 12 digits each part): exactly equal values
      are equal under both graders (2/4 = 0.5 via math-verify); values apart by more than 1e-4
      relative are unequal under both (math-verify rounds to 6 decimals; mathruler compares exactly).
      Values closer than that go to the graders.
    - `tools.reward.quick.clearly_different`: expressions (\\sqrt, \\pi, powers, one variable) or
      intervals that certainly differ: unequal under both graders.
    `tests/tools/reward/test_reward.py` and `bench/bench_reward.py` check these against `grade_full`.
    """
    if answer is None:
        return Verdict(False, "no_answer")
    if answer == ground_truth:
        return Verdict(True, "fast_equal")
    a, g = mr_normalize(answer), mr_normalize(ground_truth)
    if a == g:  # mathruler's first test: it would say yes
        return Verdict(True, "fast_equal")
    if _SPACED_DIGITS.search(answer) or _SPACED_DIGITS.search(ground_truth):
        return None  # "7 3/4" is a mixed number to mathruler, "1 000" a thousand: leave them to it
    va, vg = plain_number(a), plain_number(g)
    if va is not None and vg is not None:
        if va == vg:
            return Verdict(True, "fast_number")
        if abs(va - vg) > Fraction(1, 10_000) * max(abs(va), abs(vg)):
            return Verdict(False, "fast_number")
        return None
    if clearly_different(answer, ground_truth):
        return Verdict(False, "fast_value")
    return None


WARM_UP = [
    (r"\frac{2}{4}", r"\frac{1}{2}"),
    (r"\sqrt{12}", r"2\sqrt{3}"),
    ("x^2 + 2x + 1", "(x+1)^2"),
    (r"[1, 2)", r"(1, 2]"),
    (r"\frac{\pi}{4}", r"\pi/4"),
    (r"5\text{ cm}", "6"),
    ("x^2 + 1", "x^2 - 1"),
    (r"\sqrt{6}", r"2\sqrt{3}"),
    (r"\frac{\pi}{3}", r"\frac{\pi}{4}"),
    ("(2, 3)", "[2, 3)"),
    ("x = 3", "3"),
    (r"\{1, 2\}", "1, 2"),
    (r"50\%", "0.5"),
    ("0.785", r"\frac{\pi}{4}"),
]


def warm_up() -> None:
    """Grade a few typical pairs, right and wrong, once: the first math-verify parse builds its LaTeX
    parser, and sympy imports modules lazily (simplify, sets, ...) on first use; both cost far more
    than a later call."""
    for answer, truth in WARM_UP:
        grade_full(answer, truth)


def grade_timed(answer: str | None, ground_truth: str, seconds: float | None) -> Verdict:
    """`grade_full` under `time_limit`; a timeout is a wrong answer with by="timeout"."""
    try:
        with time_limit(seconds) as alarm:
            v = grade_full(answer, ground_truth)
    except GradeTimeout:
        return Verdict(False, "timeout")
    return Verdict(False, "timeout") if alarm.fired else v
