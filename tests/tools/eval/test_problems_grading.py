"""What make eval samples and how it grades: a shipped benchmark in the recipe's prompt, the reference answers
graded right by the recipe's reward with its vote (`pred`), and tiny-zero's reward and vote."""

from __future__ import annotations

import pytest

from tools.eval import problems as P
from tools.eval.grading import Grader


def test_a_benchmark_in_the_r1_zero_prompt() -> None:
    s = P.load("aime24", None)
    assert len(s.problems) == 30 and len({p.id for p in s.problems}) == 30
    first = s.problems[0]
    assert (
        first.source == "aime24"
        and first.messages[0]["role"] == "system"
        and "<think>" in first.messages[0]["content"]
    )


def test_reference_answers_graded_right_with_one_vote_per_answer() -> None:
    g = Grader()
    for p in P.load("aime24", None).problems[:5]:
        right, pred = g.grade(
            p.source, f"<think> x </think> <answer> \\boxed{{{p.ground_truth}}} </answer>", p.ground_truth
        )
        wrong, _ = g.grade(p.source, "<think> x </think> <answer> \\boxed{-1} </answer>", p.ground_truth)
        assert right and not wrong and pred


def test_tiny_zero_grader_and_vote() -> None:
    g = Grader("compute_score_long_addition")
    assert g.grade("addition-3d", "<think>...</think><answer>0138</answer>", "138") == (True, "138")
    assert g.grade("addition-3d", "<answer>139</answer>", "138") == (False, "139")


def test_unknown_reward_and_benchmark_refused() -> None:
    with pytest.raises(Exception, match="not in tools/reward/verl_reward.py"):
        Grader("nope")
    with pytest.raises(Exception, match="unknown benchmark 'aime99'"):
        P.check_names(["aime99"])
