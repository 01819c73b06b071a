"""The learning curve (tools/analysis/learning.py) and its place in `make report`: validation accuracy and
reward over the steps from make train's metrics, the base model's sampled accuracy as the starting line,
the rise; the report's learning.png and table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import report as RP
from tools.analysis import learning as L

KEY = "val-core/addition/acc/mean@8"
BASE = {
    "pretrain_seconds": 100.0,
    "held_out": {"problems": 20, "greedy_acc": 0.95, "sampled_acc": 0.31, "samples_per_problem": 8},
}


def _records(accs: dict[int, float], rewards: dict[int, float]) -> list[dict]:
    out = []
    for step in sorted(set(accs) | set(rewards)):
        if step in accs:
            out.append({"step": step, "kind": "validation", "attempt": 1, "metrics": {KEY: accs[step]}})
        if step in rewards:
            m = {"critic/rewards/mean": rewards[step], "timing_s/step": 1.0, "timing_s/gen": 0.5,
                 "prompt_length/mean": 40.0, "response_length/mean": 20.0}  # fmt: skip
            out.append({"step": step, "kind": "train", "attempt": 1, "metrics": m})
    return out


@pytest.fixture
def run(tmp_path: Path) -> Path:
    run = tmp_path / "tiny-learn"
    run.mkdir()
    accs = {0: 0.30, 5: 0.41, 10: 0.55, 15: 0.62}
    rewards = {s: 0.5 + 0.02 * s for s in range(1, 16)}
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records(accs, rewards)))
    (run / "base_model.json").write_text(json.dumps(BASE))
    return run


def test_curve_and_rise(run: Path) -> None:
    c = L.run_curve(run)
    assert c.key == KEY and c.accuracy == {0: 0.30, 5: 0.41, 10: 0.55, 15: 0.62}
    assert sorted(c.reward) == list(range(1, 16)) and c.reward[10] == pytest.approx(0.7)
    s = c.summary()
    assert s["base_sampled_acc"] == 0.31 and s["rise_over_base"] == pytest.approx(0.62 - 0.31)
    assert s["reward_first5"] == pytest.approx(0.56) and s["reward_last5"] == pytest.approx(0.76)
    # without the base model's figure the rise counts from the validation before training
    (run / "base_model.json").unlink()
    assert L.run_curve(run).rise() == pytest.approx(0.62 - 0.30)
    # a wanted key that is not there falls back to any val-core/*/acc/mean@n
    assert L.accuracy_key([KEY, "val-aux/x"], "val-core/other/acc/mean@8") == KEY
    assert L.accuracy_key(["val-aux/x/acc/mean@8", "val-core/x/reward/mean@8"]) is None


def test_the_rise_is_the_last_validation_not_the_best(run: Path) -> None:
    """A run that peaked and fell back: the rise is where it ended (0.45 - 0.31), not its peak (0.62)."""
    accs = {0: 0.30, 5: 0.62, 10: 0.50, 15: 0.45}
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records(accs, {1: 0.5})))
    c = L.run_curve(run)
    assert c.rise() == pytest.approx(0.45 - 0.31)
    assert c.summary()["validation_best"] == 0.62 and c.summary()["validation_last"] == 0.45


def test_the_base_model_is_the_starting_line(run: Path) -> None:
    import matplotlib.pyplot as plt

    fig = L.figure(L.run_curve(run), "t")
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    base = next(ln for name, ln in lines.items() if name.startswith("base model, sampled"))
    assert list(base.get_ydata()) == [0.31, 0.31] and base.get_linestyle() == "--"
    acc = next(ln for name, ln in lines.items() if name.startswith("validation accuracy"))
    assert list(acc.get_xdata()) == [0, 5, 10, 15] and list(acc.get_ydata()) == [0.30, 0.41, 0.55, 0.62]
    assert any(name.startswith("reward mean") for name in lines)
    plt.close(fig)
    png = L.plot(L.run_curve(run), "t")
    assert png is not None and png[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_has_the_learning_curve(run: Path) -> None:
    RP.write(run)
    out = run / "report"
    assert (out / "learning.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "report.html").read_text()
    learned = page.split('<section id="learning">', 1)[1].split("</section>", 1)[0]
    assert "<h2>Did it learn</h2>" in learned and "<th>base model</th>" in learned
    assert "<td>0.310</td>" in learned and "<td>0.620</td>" in learned and "rise +0.310" in learned
    assert '<figure id="fig-learning"' in learned and "data:image/png;base64," in learned
