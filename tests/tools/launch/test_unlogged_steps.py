"""A step saved but never logged: verl's V1 trainer saves a step's checkpoint before its weight sync,
validation and metrics, so a stop (or a failure) in between leaves a sealed checkpoint whose step
metrics.jsonl would not have. The launcher records the step as trained and unlogged, so that the records and
the checkpoints agree and a resume after it keeps the step (tests/current/test_stop_e2e.py stops a
separate_async run in that gap)."""

from __future__ import annotations

import json
from pathlib import Path

from tools.analysis import learning
from tools.launch import resume
from tools.report import live


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_saved_step_without_metrics_gets_a_row_that_says_so(tmp_path: Path) -> None:
    records = [(0, {"val-core/x/acc/mean@1": 0.5}), (1, {"timing_s/step": 2.0, learning.REWARD_KEY: 0.25})]
    merged = live.merge_metrics(tmp_path, 1, records)
    merged, added = live.add_unlogged(tmp_path, 1, merged, saved=[1, 2])
    assert added == [2]
    rows = _rows(tmp_path)
    assert [(r["step"], r["kind"]) for r in rows] == [(0, "validation"), (1, "train"), (2, "train")]
    assert rows[2]["metrics"] == {} and rows[2]["unlogged"] == live.UNLOGGED
    assert "unlogged" not in rows[1]
    live.write_steps_table(tmp_path, merged)
    table = (tmp_path / "steps.md").read_text().splitlines()
    assert table[3].startswith("| 2 | - | -") and table[-1] == f"Step 2: {live.UNLOGGED}."
    assert [p.name for p in live.plot(tmp_path, merged, "val-core/x/acc/mean@1")][:2] == [
        "reward.png",
        "response_length.png",
    ]
    assert list(learning.run_curve(tmp_path).reward) == [1]  # the unlogged step has no reward to draw


def test_logged_steps_and_unsaved_ones_add_nothing(tmp_path: Path) -> None:
    merged = live.merge_metrics(tmp_path, 1, [(1, {"timing_s/step": 2.0})])
    before = (tmp_path / "metrics.jsonl").read_bytes()
    assert live.add_unlogged(tmp_path, 1, merged, saved=[1]) == (merged, [])
    assert live.add_unlogged(tmp_path, 1, merged, saved=[]) == (merged, [])
    assert (tmp_path / "metrics.jsonl").read_bytes() == before


def test_a_resume_from_the_unlogged_step_keeps_its_row(tmp_path: Path) -> None:
    merged = live.merge_metrics(tmp_path, 1, [(1, {"timing_s/step": 2.0})])
    live.add_unlogged(tmp_path, 1, merged, saved=[2])
    said: list[str] = []
    assert resume.reconcile_records(tmp_path, 2, said.append) == []
    assert [r["step"] for r in _rows(tmp_path) if r["kind"] == "train"] == [1, 2]
    assert said == ["records: metrics.jsonl has steps 1..2, as the checkpoint of step 2"]
