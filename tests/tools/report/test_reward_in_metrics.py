"""make train's metrics.jsonl carries the reward's parts per training step, grader timeouts included
(reward/timeouts: answers cut off at the grader's time limit or the batch's deadline), from the reward
function's tally (tools/reward/tally.py): verl logs them for validation only."""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from tools.report.live import merge_metrics, reward_tally

CFG = OmegaConf.create(
    {"verl": {"data": {"train_batch_size": 2}, "actor_rollout_ref": {"rollout": {"n": 2}}}}
)


def _step(step: int) -> tuple[int, dict[str, float]]:
    return step, {"timing_s/step": 1.0, "critic/score/mean": 0.1}


def test_grader_timeouts_per_step_reach_metrics_jsonl(tmp_path: Path) -> None:
    lines = [  # attempt 2 resumed after step 3: steps 4 and 5, 4 training responses a step, one validation call
        {"split": "test", "n": 4, "format": 4, "acc": 0, "timeouts": 3, "score": 0, "seconds": 1.0},
        {"split": "train", "n": 4, "format": 2, "acc": 1, "timeouts": 0, "score": 1, "seconds": 0.5},
        {"split": "train", "n": 2, "format": 0, "acc": 0, "timeouts": 2, "score": 0, "seconds": 2.0},
        {"split": "train", "n": 2, "format": 1, "acc": 0, "timeouts": 1, "score": 0, "seconds": 1.0},
    ]
    (tmp_path / "reward-tally-2.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    records = [_step(4), _step(5)]
    reward = reward_tally(tmp_path, 2, CFG, records)
    merge_metrics(tmp_path, 2, records, reward)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    got = {r["step"]: r["metrics"] for r in rows if r["kind"] == "train"}
    assert (
        got[4]["reward/timeouts"] == 0
        and got[4]["reward/format"] == 0.5
        and got[4]["reward/accuracy"] == 0.25
    )
    assert got[5]["reward/timeouts"] == 3 and got[5]["reward/seconds"] == 3.0
    assert got[5]["critic/score/mean"] == 0.1  # verl's own metrics kept


def test_no_tally_no_reward_keys(tmp_path: Path) -> None:
    records = [_step(1)]
    merge_metrics(tmp_path, 1, records, reward_tally(tmp_path, 1, CFG, records))
    row = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert "reward/timeouts" not in row["metrics"]
