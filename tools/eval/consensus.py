"""cons@k: the answer most of a problem's k responses give, and whether it is right (DeepSeek-R1, section 3:
"cons@64", the majority vote over 64 samples).

Votes are the extracted, normalised answers (`pred`); a response with no answer does not vote. Ties go to
the answer given first, as verl's `calc_maj_val` breaks them (the first key of the largest count), and the
verdict is that of the first response giving the winning answer, as there.
"""

from __future__ import annotations

from collections.abc import Sequence


def majority(preds: Sequence[str | None]) -> int | None:
    """The index of the first response giving the most common answer; None when no response answered."""
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, pred in enumerate(preds):
        if pred is None or pred == "":
            continue
        counts[pred] = counts.get(pred, 0) + 1
        first.setdefault(pred, i)
    if not counts:
        return None
    winner = max(counts, key=counts.__getitem__)  # dicts keep insertion order: ties go to the first given
    return first[winner]


def consensus_correct(preds: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """cons@k of one problem: is the majority answer right (False when nothing was answered)."""
    if len(preds) != len(correct):
        raise ValueError(f"{len(preds)} answers but {len(correct)} verdicts")
    i = majority(preds)
    return i is not None and bool(correct[i])
