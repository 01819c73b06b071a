"""make eval's figures against verl 0.9.1's own validation metrics on the same responses
(verl/trainer/ppo/metric_utils.py process_validation_metrics, in third_party after `make bootstrap`).

What compares, and how:
- pass@1 = verl's mean@N: the same number (both the mean over problems of each problem's mean correctness).
- cons@N vs verl's maj@N/mean: verl bootstraps (1000 draws of N responses WITH replacement, the majority of
  each draw), make eval votes once over the N responses given. They agree exactly where every problem's
  answers are unanimous or its majority answer's correctness is shared by every answer (a vote cannot go
  wrong); in general they differ, and the test checks the bootstrap against its own expectation instead.
- best@N vs pass@N: verl's best@N is also a with-replacement bootstrap; its expectation is 1 - (1 - c/n)^N,
  not Chen et al.'s unbiased pass@N. The test checks verl's against that expectation, which shows what
  verl's figure is, and that make eval's pass@N is >= it (drawing without replacement never repeats a wrong one).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from tools.eval.summary import summarize

metric_utils = pytest.importorskip("verl.trainer.ppo.metric_utils")


def make(n_problems: int, n: int, seed: int, unanimous: bool) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n_problems):
        p_right = rng.random()
        for j in range(n):
            if unanimous:
                right = i % 3 == 0
                pred = "42" if right else "7"
            else:
                right = rng.random() < p_right
                pred = "42" if right else rng.choice(["7", "8", "9"])
            out.append({"id": f"p{i}", "source": "aime24", "sample": j, "pred": pred, "correct": right,
                        "length": 5, "truncated": False})  # fmt: skip
    return out


def verl_metrics(rs: list[dict]) -> dict[str, float]:
    got = metric_utils.process_validation_metrics(
        [r["source"] for r in rs],
        [r["id"] for r in rs],
        {"acc": [float(r["correct"]) for r in rs], "pred": [r["pred"] for r in rs]},
    )
    return dict(got["aime24"]["acc"])


@pytest.mark.parametrize("seed", [0, 1])
def test_pass_at_1_is_verls_mean_at_n(seed: int) -> None:
    rs = make(30, 16, seed, unanimous=False)
    assert summarize(rs)["pass@1"] == pytest.approx(verl_metrics(rs)["mean@16"], abs=1e-12)


def test_cons_is_verls_maj_where_a_vote_cannot_go_wrong() -> None:
    rs = make(30, 16, 2, unanimous=True)
    s, v = summarize(rs), verl_metrics(rs)
    assert s["cons@16"] == pytest.approx(v["maj@16/mean"], abs=1e-12)
    assert s["cons@16"] == pytest.approx(10 / 30)


def test_verls_maj_and_best_are_with_replacement_bootstraps() -> None:
    rs = make(30, 16, 3, unanimous=False)
    s, v = summarize(rs), verl_metrics(rs)
    counts = {}
    for r in rs:
        n, c = counts.get(r["id"], (0, 0))
        counts[r["id"]] = (n + 1, c + r["correct"])
    expected_best = np.mean([1 - (1 - c / n) ** 16 for n, c in counts.values()])
    assert v["best@16/mean"] == pytest.approx(expected_best, abs=0.01)
    assert s["pass@k"]["16"] >= v["best@16/mean"] - 0.01
    # the single vote and the bootstrap's mean vote land close on this mix, not equal: the bootstrap is noisy
    assert abs(s["cons@16"] - v["maj@16/mean"]) < 0.15
