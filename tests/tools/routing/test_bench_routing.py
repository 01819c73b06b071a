"""bench/bench_routing.py (`make bench-routing`): the side-by-side table of tiny-zero without and with routing
replay, summarised from run folders (synthetic: tests/tools/analysis/test_reasoning.py's tiny-zero shape with
the mismatch metrics of each case), and the runs it starts (bench_zero's run, faked: a real one is 20 min)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.tools.analysis import test_reasoning as shapes
from tools.errors import USER_ERROR, exit_status

REPO = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("bench_routing", REPO / "bench" / "bench_routing.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

MAX, MEAN = "training/rollout_probs_diff_max", "training/rollout_probs_diff_mean"
DISAGREEMENT, SHARE = "rollout/routing_disagreement", "rollout/mismatch_routing_share"


def tiny_zero(
    folder: Path, correction: str, metrics: dict[int, dict[str, float]], step_s: float = 10.0
) -> Path:
    """A tiny-zero run folder that learns (trace and accuracy rise) with `metrics` added to its train steps."""
    shapes.write_run(folder, shapes.rising, lambda s: 0.3 + 0.7 * min(1.0, s / 20))
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        if r["kind"] == "train":
            r["metrics"].update(metrics.get(r["step"], {}), **{"timing_s/step": step_s})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "config.yaml").write_text(
        f"launch:\n  correction:\n    name: {correction}\n  model_config:\n    n_routed_experts: 8\n"
        "  task:\n    max_digits: 3\n    train_max_digits: 3\n"
    )
    return folder


def without_replay(folder: Path) -> Path:
    """The issue's picture: a quiet mean, a worst token above 0.1 at two steps of 30 (0.92 at step 5), exactly
    at the bound at one (not above it); no routing metric logged."""
    m = {s: {MEAN: 2e-4, MAX: 0.04} for s in range(1, 31)}
    m[5][MAX], m[12][MAX], m[20][MAX] = 0.92, 0.3, 0.1
    return tiny_zero(folder, "none", m, step_s=10.0)


def with_replay(folder: Path) -> Path:
    m = {s: {MEAN: 1e-4, MAX: 0.02, DISAGREEMENT: 0.0, SHARE: 0.25 if s % 2 else 0.0} for s in range(1, 31)}
    return tiny_zero(folder, "r3", m, step_s=12.0)


def cells(lines: list[str], label: str) -> list[str]:
    row = next(x for x in lines if x.startswith(f"| {label}"))
    return [c.strip() for c in row.strip("|").split("|")][1:]


def test_the_table_puts_the_mismatch_and_learning_figures_side_by_side(tmp_path):
    named = [("none-0", bench.summarise(without_replay(tmp_path / "a"))),
             ("r3-0", bench.summarise(with_replay(tmp_path / "b")))]  # fmt: skip
    lines = bench.table(named)
    print("\n".join(lines))
    assert lines[0] == "| figure | none-0 | r3-0 |"
    assert cells(lines, "correction") == ["none", "r3"]
    assert cells(lines, "training/rollout_probs_diff_max: max") == ["0.92", "0.02"]
    assert cells(lines, "training/rollout_probs_diff_max: mean") == [f"{(27 * 0.04 + 0.92 + 0.3 + 0.1) / 30:.3g}",
                                                                      "0.02"]  # fmt: skip
    assert cells(lines, "training/rollout_probs_diff_mean: mean") == ["0.0002", "0.0001"]
    # above the bound: 0.92 and 0.3; 0.1 itself is not above it
    assert cells(lines, "share of steps with rollout_probs_diff_max > 0.1") == [
        "0.07 (2 of 30)",
        "0.00 (0 of 30)",
    ]
    assert cells(lines, "rollout/routing_disagreement") == ["not logged", "0.00%"]
    assert cells(lines, "rollout/mismatch_routing_share") == ["not logged", "12.5%"]
    # the report's line: an MoE run with flagged steps and no routing metric cannot tell routing from precision
    assert cells(lines, "the report's mismatch cause") == ["routing or precision", "within the bound"]
    assert cells(lines, "step time") == ["10.0", "12.0"]
    length = cells(lines, "mean response length")
    assert length[0] == length[1] and length[0].endswith(")") and "x" in length[0]
    assert (
        cells(lines, "learning checks met")[0].split(" of ")[0]
        == cells(lines, "learning checks met")[0].split(" of ")[1]
    )  # fmt: skip  (the synthetic run learns: every check met)


def test_the_bound_is_the_one_given(tmp_path):
    s = bench.summarise(without_replay(tmp_path / "a"), bound=0.05)
    assert (s["above_bound"], s["measured_steps"]) == (3, 30)


def test_a_run_without_mismatch_metrics_or_validation_shows_dashes(tmp_path):
    run = tmp_path / "bare"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "kind": "train", "attempt": 1, "metrics": {"timing_s/step": 3.0}}) + "\n"
    )
    lines = bench.table([("bare", bench.summarise(run))])
    assert cells(lines, "training/rollout_probs_diff_max: max") == ["-"]
    assert cells(lines, "share of steps") == ["-"]
    assert cells(lines, "the report's mismatch cause") == ["not measured"]
    assert cells(lines, "learning checks met") == ["-"] and cells(lines, "step time") == ["3.0"]


def test_runs_given_on_the_command_line_are_summarised(tmp_path, capsys):
    a, b = without_replay(tmp_path / "a"), with_replay(tmp_path / "b")
    out = tmp_path / "table.json"
    assert bench.main(["--runs", f"none-0={a}", f"r3-0={b}", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| figure | none-0 | r3-0 |" in printed
    assert [r["name"] for r in json.loads(out.read_text())] == ["none-0", "r3-0"]


@pytest.mark.parametrize("bad", ["none-0", "=x", "none-0=/no/such/folder"])
def test_a_bad_runs_argument_is_a_user_error(bad, capsys):
    assert exit_status(bench.main, ["--runs", bad]) == USER_ERROR
    assert "error: --runs" in capsys.readouterr().err


def test_each_seed_runs_without_and_with_replay_and_a_kept_run_is_not_run_again(
    tmp_path, monkeypatch, capsys
):
    calls = []

    def fake_run_one(name, tmp, cache, steps, extra=()):
        calls.append((name, tmp.name, list(extra)))
        make = with_replay if "correction=r3" in extra else without_replay
        folder = make(tmp / "outputs" / "current" / f"zero-{name}")
        return {"name": name, "folder": str(folder)}

    monkeypatch.setattr(bench.bench_zero, "run_one", fake_run_one)
    monkeypatch.setattr(bench.bench_zero, "report", lambda r: None)
    keep = tmp_path / "keep"
    assert bench.main(["--keep", str(keep), "--cache", str(tmp_path / "cache")]) == 0
    assert calls == [
        ("main-0", "none", ["correction=none"]),
        ("main-0", "r3", ["correction=r3"]),
        ("main-1", "none", ["correction=none"]),
        ("main-1", "r3", ["correction=r3"]),
    ]
    assert "| figure | none-0 | r3-0 | none-1 | r3-1 |" in capsys.readouterr().out
    calls.clear()  # again, into the same folder: every run is there, none runs, the table is printed again
    assert bench.main(["--keep", str(keep), "--set"]) == 0
    assert calls == [] and "| figure | none-0 | r3-0 | none-1 | r3-1 |" in capsys.readouterr().out
