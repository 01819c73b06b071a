"""The paper's picture on a run's page (tools/report/paper.py), on a synthetic flagship run folder:
pass@1 and cons@N read from verl's validation keys, the paper's points drawn for the flagship only, the
`make eval` summaries in a table, and nothing for an overlay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.report import paper
from tools.report import runs as R


def make_run(root: Path, recipe: str) -> Path:
    run = root / recipe
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"launch:\n  recipe: {recipe}\n")
    lines = []
    for step in (0, 10, 20):
        acc = 0.1 + step / 40
        lines.append({"step": step, "kind": "validation", "attempt": 1,
                      "metrics": {"val-core/aime24/acc/mean@16": acc, "val-core/aime24/acc/maj@16/mean": acc + 0.1}})  # fmt: skip
        if step:
            lines.append(
                {
                    "step": step,
                    "kind": "train",
                    "attempt": 1,
                    "metrics": {
                        "response_length/mean": 100.0 + step,
                        "training/global_step": step,
                        "timing_s/step": 1.0,
                    },
                }
            )
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    ev = run / "eval" / "step_20" / "aime24"
    ev.mkdir(parents=True)
    overall = {"pass@1": 0.6, "pass@1_stderr": 0.05, "cons@16": 0.7, "pass@k": {"1": 0.6, "16": 0.9},
               "samples_per_problem": 16, "truncation_rate": 0.25}  # fmt: skip
    (ev / "summary.json").write_text(json.dumps({"overall": overall}))
    return run


def test_curves_lengths_and_table(tmp_path: Path) -> None:
    run = R.read(make_run(tmp_path, "deepseek-v3-671b-a3"))
    c = paper.curves(run)
    assert c["aime24"]["pass@1"] == [(0, 0.1), (10, 0.35), (20, 0.6)]
    assert c["aime24"]["cons"] == [
        (0, pytest.approx(0.2)),
        (10, pytest.approx(0.45)),
        (20, pytest.approx(0.7)),
    ]
    assert paper.lengths(run) == [(10, 110.0), (20, 120.0)]
    images: dict[str, bytes] = {}
    html = paper.section([run], images)
    assert html is not None and images["paper.png"][:4] == b"\x89PNG"
    assert "15.6%" in html and "71.0%" in html  # the flagship's reference points
    assert "step 20 · aime24" in html and "0.600 ± 0.050" in html and "0.700" in html and "25.0%" in html


def test_reference_points_only_for_the_flagship_and_no_section_for_an_overlay(tmp_path: Path) -> None:
    run = R.read(make_run(tmp_path, "tiny-zero"))
    html = paper.section([run], {})
    assert html is not None and "15.6%" not in html
    assert paper.section([run, run], {}) is None
