"""pass@k, cons@k and the summary: hand-computed values, and the unbiased estimator against its definition."""

from __future__ import annotations

import math
import random

import pytest

from tools.eval.consensus import consensus_correct, majority
from tools.eval.passk import ks_up_to, pass_at_k
from tools.eval.summary import summarize, summarize_by_source


@pytest.mark.parametrize(
    "n,c,k", [(16, 0, 1), (16, 3, 1), (16, 3, 4), (16, 15, 2), (64, 5, 64), (10, 10, 3), (200, 7, 50)]
)
def test_pass_at_k_is_one_minus_the_binomial_ratio(n: int, c: int, k: int) -> None:
    want = 1.0 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_pass_at_1_is_the_share_right_and_pass_at_n_is_any_right() -> None:
    assert pass_at_k(16, 4, 1) == pytest.approx(0.25)
    assert pass_at_k(16, 1, 16) == 1.0
    assert pass_at_k(16, 0, 16) == 0.0


def test_pass_at_k_stays_finite_where_binomials_overflow_a_float() -> None:
    value = pass_at_k(2000, 3, 1000)  # C(2000, 1000) ~ 1e600 overflows a float
    assert value == pytest.approx(1 - (1000 * 999 * 998) / (2000 * 1999 * 1998), rel=1e-12)


def test_pass_at_k_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_ks() -> None:
    assert ks_up_to(16) == [1, 2, 4, 8, 16]
    assert ks_up_to(64)[-1] == 64 and len(ks_up_to(64)) == 7
    assert ks_up_to(12) == [1, 2, 4, 8, 12]
    assert ks_up_to(1) == [1]


def test_pass_at_k_matches_drawing_k_without_replacement() -> None:
    rng = random.Random(0)
    right = [True] * 3 + [False] * 13
    hits = sum(any(rng.sample(right, 4)) for _ in range(40000)) / 40000
    assert hits == pytest.approx(pass_at_k(16, 3, 4), abs=0.01)


def test_majority_counts_answers_and_breaks_ties_by_first_given() -> None:
    assert majority(["3", "5", "5", None, "3", "5"]) == 1
    assert majority(["7", "8"]) == 0  # a tie: the first given
    assert majority([None, "", None]) is None
    assert consensus_correct(["3", "5", "5"], [True, False, False]) is False
    assert consensus_correct(["3", "5", "3"], [True, False, True]) is True
    assert consensus_correct([None, None], [False, False]) is False


def records(per_problem: list[tuple[list[bool], list[str | None]]], source: str = "s") -> list[dict]:
    out = []
    for i, (correct, preds) in enumerate(per_problem):
        for j, (c, p) in enumerate(zip(correct, preds, strict=True)):
            out.append({"id": f"{source}{i}", "source": source, "sample": j, "pred": p, "correct": c,
                        "length": 10 if c else 30, "truncated": not c and j == 0})  # fmt: skip
    return out


def test_summary_by_hand() -> None:
    rs = records(
        [
            ([True, True, False, False], ["1", "1", "2", "3"]),  # 0.5, cons right
            ([False, False, False, True], ["4", "4", "5", "9"]),  # 0.25, cons wrong
        ]
    )
    s = summarize(rs)
    assert s["problems"] == 2 and s["responses"] == 8 and s["samples_per_problem"] == 4
    assert s["pass@1"] == pytest.approx(0.375)
    assert s["pass@1_stderr"] == pytest.approx(
        math.sqrt(((0.5 - 0.375) ** 2 + (0.25 - 0.375) ** 2) / 1) / math.sqrt(2)
    )
    assert s["cons@4"] == pytest.approx(0.5)
    assert s["pass@k"]["1"] == pytest.approx(0.375)
    assert s["pass@k"]["2"] == pytest.approx(((1 - 1 / 6) + (1 - 3 / 6)) / 2)
    assert s["pass@k"]["4"] == 1.0
    assert s["mean_length_right"] == 10 and s["mean_length_wrong"] == 30
    assert s["truncation_rate"] == pytest.approx(1 / 8)  # the first response of problem 2


def test_summary_by_source_splits_buckets() -> None:
    rs = records([([True, True], ["1", "1"])], "addition-1d") + records(
        [([False, False], ["2", "3"])], "addition-3d"
    )
    s = summarize_by_source(rs)
    assert s["overall"]["pass@1"] == 0.5
    assert s["by_source"]["addition-1d"]["pass@1"] == 1.0
    assert s["by_source"]["addition-3d"]["pass@1"] == 0.0
