"""One benchmark's responses -> its summary (summary.json), overall and per data source.

A response record (a line of responses.jsonl): id (the problem), source (its data source: the benchmark's
name, or addition-<n>d for tiny-zero's held-out buckets), sample (0..K-1), text, pred (the extracted,
normalised answer, or null), correct (bool), length (generated tokens), truncated (bool: stopped by the
length limit, not by the model).

    pass@1      the mean over problems of each problem's share of right responses (the paper's pass@1,
                verl's mean@N), with its standard error over problems (sample std / sqrt(problems))
    cons@K      the majority vote's correctness (consensus.py), over problems (verl's maj@N, which verl
                bootstraps; see tests/tools/eval/test_verl_agreement.py for what compares)
    pass@k      k = 1, 2, 4, ..., K: Chen et al.'s unbiased estimator (passk.py)
    length      mean generated tokens of right and of wrong responses; the truncation rate
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tools.eval.consensus import consensus_correct
from tools.eval.passk import ks_up_to, mean_pass_at_k


def by_problem(records: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Responses grouped by problem id, each group in sample order."""
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        groups[str(r["id"])].append(r)
    return {pid: sorted(rs, key=lambda r: int(r["sample"])) for pid, rs in groups.items()}


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None


def summarize(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The figures of one set of problems (module docstring). Every problem must have at least one response."""
    groups = by_problem(records)
    if not groups:
        raise ValueError("no responses to summarize")
    counts = [(len(rs), sum(bool(r["correct"]) for r in rs)) for rs in groups.values()]
    k = min(n for n, _ in counts)
    per_problem = np.array([c / n for n, c in counts])
    stderr = float(per_problem.std(ddof=1) / np.sqrt(len(per_problem))) if len(per_problem) > 1 else None
    cons = [
        consensus_correct([r.get("pred") for r in rs], [bool(r["correct"]) for r in rs])
        for rs in groups.values()
    ]
    right = [float(r["length"]) for r in records if r["correct"]]
    wrong = [float(r["length"]) for r in records if not r["correct"]]
    return {
        "problems": len(groups),
        "responses": len(records),
        "samples_per_problem": k
        if k == max(n for n, _ in counts)
        else {"min": k, "max": max(n for n, _ in counts)},
        "pass@1": float(per_problem.mean()),
        "pass@1_stderr": stderr,
        f"cons@{k}": float(np.mean(cons)),
        "pass@k": {str(j): mean_pass_at_k(counts, j) for j in ks_up_to(k)},
        "mean_length": _mean([float(r["length"]) for r in records]),
        "mean_length_right": _mean(right),
        "mean_length_wrong": _mean(wrong),
        "truncation_rate": float(np.mean([bool(r["truncated"]) for r in records])),
        "answered_rate": float(np.mean([r.get("pred") not in (None, "") for r in records])),
    }


def summarize_by_source(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """{"overall": summarize(all), "by_source": {source: summarize(its responses)}} (by_source only when the
    problems come from more than one data source, e.g. tiny-zero's addition-1d .. addition-3d)."""
    out: dict[str, Any] = {"overall": summarize(records)}
    sources: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in records:
        sources[str(r.get("source", ""))].append(r)
    if len(sources) > 1:
        out["by_source"] = {s: summarize(rs) for s, rs in sorted(sources.items())}
    return out
