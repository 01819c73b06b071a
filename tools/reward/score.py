"""Rewards from responses: the recipe's deepscaler score, accuracy only, and strict format.

- deepscaler: 0.33 when the response has the strict format (`tools.reward.extract.check_format`) plus
  0.67 when its final boxed answer is correct: 0, 0.33, 0.67 or 1.0.
- accuracy:   1.0 when the final boxed answer is correct, whatever the format.
- strict:     1.0 only when the format is right *and* the answer is correct.

Each result is a dict with the same numeric keys (verl collects them into reward_extra_info):
score, acc, format, timeout; with `with_pred`, also `pred`, the answer's vote (`tools.reward.vote`), from
which verl 0.9.1 computes maj@N in validation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tools.reward.extract import extract
from tools.reward.grade import Verdict
from tools.reward.pool import GradePool
from tools.reward.vote import vote_key

FORMAT_WEIGHT = 0.33
ANSWER_WEIGHT = 0.67
MODES = ("deepscaler", "accuracy", "strict")


def combine(mode: str, format_ok: bool, correct: bool) -> float:
    if mode == "deepscaler":
        return FORMAT_WEIGHT * format_ok + ANSWER_WEIGHT * correct
    if mode == "accuracy":
        return float(correct)
    if mode == "strict":
        return float(format_ok and correct)
    raise ValueError(f"reward mode {mode!r} is not one of {', '.join(MODES)}")


def ground_truths_of(ground_truth: Any) -> list[str]:
    """One or several accepted answers (a list in the parquet) as strings."""
    if isinstance(ground_truth, str):
        return [ground_truth]
    if ground_truth is None:
        return []
    try:
        return [str(g) for g in ground_truth]
    except TypeError:
        return [str(ground_truth)]


def score_responses(
    responses: Sequence[str | None],
    ground_truths: Sequence[Any],
    pool: GradePool,
    mode: str = "deepscaler",
    think_prefilled: bool = False,
    with_pred: bool = False,
) -> list[dict[str, float | str]]:
    """Score a batch; the answer grading goes through `pool` (cache, fast path, timed workers)."""
    if mode not in MODES:
        raise ValueError(f"reward mode {mode!r} is not one of {', '.join(MODES)}")
    if len(responses) != len(ground_truths):
        raise ValueError(f"{len(responses)} responses but {len(ground_truths)} ground truths")
    extracted = [extract(r, think_prefilled) for r in responses]
    truths = [ground_truths_of(g) for g in ground_truths]
    pairs: list[tuple[str | None, str]] = []
    owner: list[int] = []
    for i, (ex, ts) in enumerate(zip(extracted, truths, strict=True)):
        if ex.answer is None:
            continue
        for t in ts:
            pairs.append((ex.answer, t))
            owner.append(i)
    verdicts: list[list[Verdict]] = [[] for _ in responses]
    for i, v in zip(owner, pool.grade(pairs), strict=True):
        verdicts[i].append(v)
    out: list[dict[str, float | str]] = []
    for ex, vs in zip(extracted, verdicts, strict=True):
        correct = any(v.correct for v in vs)
        timed_out = any(v.by in ("timeout", "deadline") for v in vs)
        result: dict[str, float | str] = {
            "score": combine(mode, ex.format_ok, correct),
            "acc": float(correct),
            "format": float(ex.format_ok),
            "timeout": float(timed_out),
        }
        if with_pred:
            result["pred"] = vote_key(ex.answer)
        out.append(result)
    return out
