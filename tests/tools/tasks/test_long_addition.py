"""The long-addition task (tools/tasks/long_addition.py): the two formats, the trace detector and the reward
agree with each other, so that the reward scores exactly what the base model was taught."""

from __future__ import annotations

import random

import pytest

from tools.reward import verl_reward
from tools.tasks import long_addition as T


def test_trace_columns_least_significant_first_with_the_carry():
    p = T.Problem(2026, 4804)
    assert T.trace_response(p) == "<think>6+4+0=10;2+0+1=3;0+8+0=8;2+4+0=6;</think><answer>6830</answer>"
    assert T.direct_response(p) == "<answer>6830</answer>"
    assert T.trace_response(T.Problem(5, 7)) == "<think>5+7+0=12;</think><answer>12</answer>"


@pytest.mark.parametrize("seed", range(5))
def test_every_trace_sums_right(seed):
    rng = random.Random(seed)
    for n in range(1, 7):
        p = T.draw(rng, n)
        assert p.digits == n
        for fmt in T.FORMATS:
            r = T.score(T.response(p, fmt), p.answer)
            assert r == {"score": 1.0, "acc": 1.0, "trace": float(fmt == "trace")}


def test_score_is_correctness_only_and_reports_the_trace_tag():
    truth = "6830"
    assert T.score("<answer>6831</answer>", truth)["score"] == 0.0
    # `trace` is the tag the response chose, whatever follows it: a right answer after garbage is right,
    # and its tag counts as a trace tag (the tag rate); it is not a valid trace (valid_trace below)
    assert T.score("<think>garbage</think><answer>6830</answer>", truth) == {
        "score": 1.0,
        "acc": 1.0,
        "trace": 1.0,
    }
    assert not T.valid_trace("<think>garbage</think><answer>6830</answer>", T.parse_problem("4213+2617="))
    assert T.score("6830", truth)["score"] == 0.0  # no answer tags: no answer
    assert T.score("<answer>06830</answer>", truth)["score"] == 1.0  # leading zeros are the same number
    assert T.score(None, truth)["acc"] == 0.0
    assert T.closed("<answer>12</answer>") and not T.closed("<answer>12")


def test_problems_are_distinct_seeded_and_exclude_the_held_out():
    test = T.problems(1, range(1, 4), 16)
    again = T.problems(1, range(1, 4), 16)
    assert test == again and len(set(test)) == 48
    train = T.problems(0, range(1, 4), 200, exclude=set(test))
    assert not set(train) & set(test)
    assert sum(1 for p in train if p.digits == 1) == 100 - 16  # every one-digit sum that is not held out


def test_problem_text_round_trips_and_names_its_bucket():
    p = T.Problem(48213, 90577)
    assert T.parse_problem(p.text) == p and p.data_source == "addition-5d"
    assert T.digits_of_source("addition-5d") == 5 and T.digits_of_source("gsm8k") is None
    with pytest.raises(ValueError, match="not a long-addition problem"):
        T.parse_problem("What is 1 + 2?")


def test_the_reward_entry_point_scores_with_the_task(monkeypatch, tmp_path):
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "verl-metrics-1.jsonl"))
    r = verl_reward.compute_score_long_addition(
        "addition-2d", "<think>7+3+0=10;1+8+1=10;</think><answer>100</answer>", "100"
    )
    assert r == {"score": 1.0, "acc": 1.0, "trace": 1.0}
    # the no-pay control pays a closed answer, right or wrong, and still logs which was right
    wrong = "<answer>99</answer>"
    assert verl_reward.compute_score_long_addition("addition-2d", wrong, "100")["score"] == 0.0
    assert verl_reward.compute_score_long_addition_blind("addition-2d", wrong, "100") == {
        "score": 1.0,
        "acc": 0.0,
        "trace": 0.0,
    }
    assert verl_reward.compute_score_long_addition_blind("addition-2d", "<answer>99", "100")["score"] == 0.0
    from tools.reward import tally

    lines = tally.read(tmp_path / "reward-tally-1.jsonl")
    assert lines[0]["trace"] == 1.0
    steps = tally.per_step(
        [{"split": "train", "n": 1, "acc": 1, "trace": 1}, {"split": "train", "n": 1, "acc": 0, "trace": 0}],
        2,
        1,
    )
    assert steps[1]["reward/trace"] == 0.5


def test_the_tally_splits_a_steps_accuracy_by_format(monkeypatch, tmp_path):
    """Does the trace pay? Per step, the accuracy of the traced responses and of the direct ones, from a
    batch call's line (its `trace_acc`) and from one-response lines of a file written before that key."""
    from tools.reward import tally

    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "verl-metrics-1.jsonl"))
    results = [{"acc": 1.0, "trace": 1.0}, {"acc": 1.0, "trace": 1.0}, {"acc": 0.0, "trace": 1.0},
               {"acc": 1.0, "trace": 0.0}, {"acc": 0.0, "trace": 0.0}, {"acc": 0.0, "trace": 0.0}]  # fmt: skip
    tally.record(results, [{"split": "train"}] * 6, 0.01)
    old = [{"split": "train", "n": 1, **r} for r in results]  # one response a line, no trace_acc
    for lines in (tally.read(tmp_path / "reward-tally-1.jsonl"), old):
        step = tally.per_step(lines, 6, 1)[1]
        assert step["reward/accuracy_with_trace"] == pytest.approx(2 / 3)
        assert step["reward/accuracy_without_trace"] == pytest.approx(1 / 3)
        assert step["reward/accuracy"] == pytest.approx(0.5)
    # every response traced: no accuracy without it, rather than a made-up 0
    only = tally.per_step([{"split": "train", "n": 2, "acc": 1, "trace": 2, "trace_acc": 1}], 2, 1)[1]
    assert only["reward/accuracy_with_trace"] == 0.5 and "reward/accuracy_without_trace" not in only


def test_a_valid_trace_is_every_column_right_for_this_problem():
    p = T.parse_problem("482+905=")  # columns 2+5+0=7; 8+0+0=8; 4+9+0=13;
    good = T.trace_response(p)
    assert good.startswith("<think>2+5+0=7;8+0+0=8;4+9+0=13;</think>") and T.valid_trace(good, p)
    assert T.valid_trace(
        "<think> 2+5+0=7; 8+0+0=8;\n4+9+0=13; </think><answer>1387</answer>", p
    )  # spaces aside
    assert T.valid_trace(good.replace("<answer>1387", "<answer>1388"), p)  # the trace, not the answer
    for bad in (
        "<think>2+5+0=7;8+0+0=8;4+9+0=12;</think><answer>1387</answer>",  # a wrong sum
        "<think>2+5+0=7;8+0+1=9;4+9+0=13;</think><answer>1387</answer>",  # a carry from nowhere
        "<think>2+5+0=7;8+0+0=8;</think><answer>1387</answer>",  # a column missing
        "<think>2+5+0=7;8+0+0=8;4+9+0=13;1+1+0=2;</think><answer>1387</answer>",  # one too many
        "<think>3+4+0=7;8+0+0=8;4+9+0=13;</think><answer>1387</answer>",  # another problem's digits
        "<think>2+5+0=7;8+0+0=8;4+9+0=13;",  # never closed
        T.direct_response(p),
    ):
        assert T.uses_trace(bad) == bad.startswith("<think>") and not T.valid_trace(bad, p), bad
