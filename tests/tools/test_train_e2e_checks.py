"""The end-to-end tests' shared checks (tests/train_e2e.py) can fail: run on a made-up run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import train_e2e as e2e


def run_folder(tmp_path: Path, calculate_log_probs: bool, diffs: list[float | None]) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.yaml").write_text(
        f"verl:\n  actor_rollout_ref:\n    rollout:\n      calculate_log_probs: {str(calculate_log_probs).lower()}\n"
    )
    rows = []
    for step, d in enumerate(diffs, 1):
        m = {"timing_s/step": 1.0} | ({"training/rollout_probs_diff_mean": d} if d is not None else {})
        rows.append({"step": step, "kind": "train", "metrics": m})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_the_hand_over_check_fails_where_the_rollout_should_return_log_probs_and_does_not(tmp_path):
    """Before, a run with calculate_log_probs off returned {} and passed, on any stack."""
    run = run_folder(tmp_path, False, [None, None])
    with pytest.raises(AssertionError, match="calculate_log_probs is False"):
        e2e.check_rollout_follows_actor(run, expected=True)
    assert e2e.check_rollout_follows_actor(run, expected=False) == {}  # published's HF rollout: none to check


def test_the_hand_over_check_fails_on_a_drift_or_a_missing_step(tmp_path):
    assert e2e.check_rollout_follows_actor(run_folder(tmp_path / "a", True, [1e-4, 2e-4]), expected=True)
    with pytest.raises(AssertionError, match="does not sample from the actor"):
        e2e.check_rollout_follows_actor(run_folder(tmp_path / "b", True, [1e-4, 0.2]), expected=True)
    with pytest.raises(AssertionError):
        e2e.check_rollout_follows_actor(run_folder(tmp_path / "c", True, [1e-4, None]), expected=True)
    assert e2e.rollout_returns_log_probs("current") and not e2e.rollout_returns_log_probs("published")
