"""The grader on the shipped benchmarks: every reference answer graded right against itself, equivalent
forms of MATH-500 answers graded as a person would (tools/reward/equivalents.py), and the vote (`pred`)
from which verl computes maj@N (cons@N)."""

from __future__ import annotations

import numpy as np
import pytest

from tools.data.benchmarks import BENCHMARKS, load_benchmark
from tools.reward.equivalents import EQUIVALENTS
from tools.reward.grade import grade_full
from tools.reward.pool import GradePool
from tools.reward.score import score_responses
from tools.reward.vote import NO_ANSWER, vote_key


def respond(answer: str) -> str:
    return f"<think>\nworking\n</think>\n<answer>The answer is \\boxed{{{answer}}}.</answer>"


@pytest.fixture(scope="module")
def math500_gold() -> dict[str, str]:
    return {p.id: p.answer for p in load_benchmark("math500")}


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_every_reference_answer_is_right_against_itself(name: str) -> None:
    problems = load_benchmark(name)
    truths = [p.answer for p in problems]
    responses = [respond(p.answer) for p in problems]
    # the reward's path (extraction from \boxed{} in <answer>, cache and fast path), and the graders
    # themselves (no fast path: mathruler, then math-verify), which a string compare cannot stand in for
    for fast in (True, False):
        with GradePool(workers=0, time_limit=20.0, use_fast_path=fast) as pool:
            results = score_responses(responses, truths, pool, "accuracy", with_pred=True)
        wrong = [(p.id, p.answer) for p, r in zip(problems, results, strict=True) if r["acc"] != 1.0]
        assert wrong == [], f"fast path {fast}"
    assert all(r["pred"] == vote_key(t) != NO_ANSWER for r, t in zip(results, truths, strict=True))


def test_a_number_with_a_unit_word_is_the_number_in_that_unit() -> None:
    """What mathruler and math-verify both miss (bench/grader_vs_math_verify.py): MATH-500 writes some units
    as \\mbox{ inches}^2, a model as inches^2."""
    gold = r"864 \mbox{ inches}^2"
    assert grade_full("864 inches^2", gold).by == "unit" and grade_full("864 inches^2", gold).correct
    assert not grade_full("865 inches^2", gold).correct and not grade_full("864 feet^2", gold).correct
    assert not grade_full("864x^2", gold).correct  # a variable is no unit


def test_aime_leading_zeros_are_the_same_number() -> None:
    assert grade_full("25", "025").correct and grade_full("025", "25").correct
    assert vote_key("025") == vote_key("25") == "25"
    assert not grade_full("250", "025").correct


@pytest.mark.parametrize(
    ("uid", "answer", "right"), EQUIVALENTS, ids=[f"{u.split('/', 1)[1]}:{a}" for u, a, _ in EQUIVALENTS]
)
def test_equivalent_forms_of_math500_answers(math500_gold, uid: str, answer: str, right: bool) -> None:
    gold = math500_gold[uid]
    with GradePool(workers=0, time_limit=20.0) as pool:
        (r,) = score_responses([respond(answer)], [gold], pool, "accuracy")
    assert r["acc"] == float(right), f"{answer!r} against {gold!r}"
    assert grade_full(answer, gold).correct == right


def test_votes_never_merge_answers_the_grader_tells_apart(math500_gold) -> None:
    """Sound: two answers with one vote key are graded alike against any gold. Together where it is cheap:
    the common rewritings vote with the reference answer."""
    answers_by_gold: dict[str, set[str]] = {}
    for uid, answer, _ in EQUIVALENTS:
        answers_by_gold.setdefault(math500_gold[uid], {math500_gold[uid]}).add(answer)
    for gold, answers in answers_by_gold.items():
        for a in answers:
            for b in answers:
                if vote_key(a) == vote_key(b):
                    assert grade_full(a, gold).correct == grade_full(b, gold).correct, (a, b, gold)
    together = [
        ("0.5", r"\frac{1}{2}", r"\dfrac12", "1/2", r"\frac{2}{4}"),
        ("90", r"90^\circ", r"90^{\circ}"),
        ("5", r"5\text{ cm}"),
        ("10080", "10,080", r"10,\!080"),
        (r"\text{(C)}", "(C)", "C"),
        (r"\left( 3, \frac{\pi}{2} \right)", r"(3,\frac{\pi}{2})", r"(3, \dfrac{\pi}{2})"),
        ("-3", "- 3"),
        ("864 inches^2", r"864 \mbox{ inches}^2", r"864\mbox{inches}^{2}"),
    ]
    for forms in together:
        assert len({vote_key(f) for f in forms}) == 1, forms
    assert vote_key("3") != vote_key("-3") and vote_key("(C)") != vote_key("(B)")
    assert vote_key("15 m^2") != vote_key(r"15\mbox{ cm}^2")
    assert vote_key(None) == vote_key("  ") == NO_ANSWER


def test_verl_majority_vote_counts_equal_answers_together() -> None:
    """verl's own validation metrics (metric_utils.process_validation_metrics) on the reward's results, as
    its reward loop hands them over (one numpy array per key): 10 right answers in five spellings against
    6 of one wrong answer. With `pred` the right answer wins the vote; voting on the raw text, it loses."""
    from verl.trainer.ppo.metric_utils import process_validation_metrics

    spellings = ["0.5", r"\frac{1}{2}", r"\dfrac12", "1/2", r"\frac{2}{4}"] * 2 + ["3"] * 6
    with GradePool(workers=0, time_limit=20.0) as pool:
        results = score_responses(
            [respond(a) for a in spellings], ["1/2"] * 16, pool, "accuracy", with_pred=True
        )
    infos = {k: np.array([r[k] for r in results]).tolist() for k in results[0]}
    metrics = process_validation_metrics(["aime24"] * 16, ["p0"] * 16, infos)["aime24"]["acc"]
    assert metrics["mean@16"] == pytest.approx(10 / 16)
    raw = dict(infos, pred=spellings)
    raw_metrics = process_validation_metrics(["aime24"] * 16, ["p0"] * 16, raw)["aime24"]["acc"]
    # bootstrapped (verl resamples 16 of the 16 with replacement, seed 42): 0.857 against 0.206 here
    assert metrics["maj@16/mean"] > 0.75 > 0.35 > raw_metrics["maj@16/mean"]
