"""tools/analysis/reasoning.py: R1-Zero's figures from a run folder, on synthetic runs whose shape is known: one
where the trace takes over (length and accuracy rise together), one where nothing moves, one where length grows
while accuracy falls. The checks must tell them apart."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tools.analysis import reasoning
from tools.report import runs


def write_run(folder: Path, trace_at, acc_at, steps: int = 30, clip: float = 0.0, edge=(0.95, 0.1)) -> Path:
    """A run folder as make train leaves it: metrics.jsonl with train and validation records, validation dumps."""
    folder.mkdir(parents=True)
    records = []
    for s in range(1, steps + 1):
        t = trace_at(s)
        m = {"timing_s/step": 1.0, "response_length/mean": 6 + 20 * t, "response_length/clip_ratio": clip,
             "reward/trace": t, "actor/entropy": 0.5, "actor/kl_loss": 0.01, "actor/pg_clipfrac": 0.0,
             "actor/grad_norm": 1.0, "critic/rewards/mean": acc_at(s),
             "reward/accuracy_with_trace": edge[0], "reward/accuracy_without_trace": edge[1]}  # fmt: skip
        records.append({"step": s, "kind": "train", "attempt": 1, "metrics": m})
    (folder / "validation").mkdir()
    for v in range(0, steps + 1, 10):
        t, a = trace_at(max(v, 1)), acc_at(max(v, 1))
        m = {}
        for n in (1, 2, 3):
            m[f"val-core/addition-{n}d/acc/mean@4"] = 1.0 if n == 1 else a
            m[f"val-aux/addition-{n}d/trace/mean@4"] = t
        records.append({"step": v, "kind": "validation", "attempt": 1, "metrics": m})
        rows = []
        for i in range(8):
            traced = i < round(8 * t)
            right = i < round(8 * a)
            out = (
                "<think>" + "1+2+0=3;" * 3 + "</think><answer>333</answer>"
                if traced
                else "<answer>333</answer>"
            )
            rows.append({"input": "123+210=", "output": out, "acc": float(right), "trace": float(traced)})
        (folder / "validation" / f"{v}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    records.sort(key=lambda r: (r["step"], r["kind"] != "validation"))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    held = {
        part: {str(n): {"acc": 1.0 if n == 1 else 0.05} for n in (1, 2, 3)} for part in ("greedy", "sampled")
    }
    (folder / "base_model.json").write_text(json.dumps({"held_out": held}))
    final = {
        part: {str(n): {"acc": 1.0 if n == 1 else acc_at(steps)} for n in (1, 2, 3)}
        for part in ("greedy", "sampled")
    }
    (folder / "final_eval.json").write_text(json.dumps(final))
    return folder


def rising(s: int) -> float:
    return min(1.0, 0.25 + 0.75 * s / 20)


def failed(checks: list[reasoning.Check]) -> set[str]:
    return {c.name for c in checks if not c.met}


def test_the_mechanism_passes_every_check(tmp_path):
    run = write_run(tmp_path / "main", rising, lambda s: 0.3 + 0.7 * min(1.0, s / 20))
    pic = reasoning.picture(runs.read(run))
    f = reasoning.figures(pic)
    assert f["length_ratio"] > 1.9 and f["trace_last10"] == 1.0
    assert f["spearman_length_accuracy"] == pytest.approx(1.0)
    assert f["right_length"] > f["wrong_length"] or math.isnan(f["wrong_length"])
    assert failed(reasoning.checks(f)) == set()
    assert pic.examples and all(p == "123+210=" for p, _ in pic.examples.values())
    assert reasoning.draw([pic]).startswith(b"\x89PNG")


def test_nothing_moving_fails_the_main_checks_and_passes_no_edge(tmp_path):
    run = write_run(tmp_path / "flat", lambda s: 0.25, lambda s: 0.3)
    f = reasoning.figures(reasoning.picture(runs.read(run)))
    missed = failed(reasoning.checks(f))
    assert "mean response length, last 10 / first 5 steps" in missed
    assert "trace rate, last 10 steps" in missed
    assert failed(reasoning.checks(f, "no-edge")) == set()


def test_the_no_pay_control_fails_when_the_trace_rises(tmp_path):
    """A run whose reward is blind to the sum answers to the no-pay bounds (kind_of reads launch.reward): flat
    passes them, a trace that rises and grows the responses does not."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"launch": {"reward": reasoning.BLIND_REWARD, "task": {"train_max_digits": 3}}})
    assert reasoning.kind_of(cfg) == "no-pay"
    assert (
        reasoning.kind_of(OmegaConf.create({"launch": {"reward": "compute_score_long_addition"}})) == "main"
    )
    flat = reasoning.figures(
        reasoning.picture(runs.read(write_run(tmp_path / "flat", lambda s: 0.25, lambda s: 0.3)))
    )
    assert failed(reasoning.checks(flat, "no-pay")) == set()
    grew = reasoning.figures(
        reasoning.picture(runs.read(write_run(tmp_path / "grew", rising, lambda s: 0.3)))
    )
    assert failed(reasoning.checks(grew, "no-pay")) == {
        "mean response length, last 10 / first 5 steps",
        "trace rate, last 10 - first 5 steps",
    }


def test_the_traces_edge_is_measured_from_the_first_steps(tmp_path):
    pic = reasoning.picture(
        runs.read(write_run(tmp_path / "edge", rising, lambda s: 0.5, edge=(0.975, 0.95)))
    )
    assert reasoning.figures(pic)["edge_first5"] == pytest.approx(0.025)
    assert "right 0.975, without 0.950 (+0.025)" in "\n".join(reasoning.describe(pic, "no-edge"))
    pic.acc_direct.clear()  # every response traced: no edge to tell
    assert reasoning.edge_line(pic) is None and math.isnan(reasoning.figures(pic)["edge_first5"])


def test_length_without_accuracy_is_not_the_mechanism(tmp_path):
    run = write_run(tmp_path / "bias", rising, lambda s: max(0.0, 0.3 - s / 100))
    missed = failed(reasoning.checks(reasoning.figures(reasoning.picture(runs.read(run)))))
    assert "sampled accuracy, two hardest buckets, last - first validation" in missed
    assert "Spearman(length, accuracy) over the validation points" in missed


def test_truncation_fails_every_kind(tmp_path):
    run = write_run(tmp_path / "cut", rising, lambda s: 0.9, clip=0.2)
    f = reasoning.figures(reasoning.picture(runs.read(run)))
    for kind in ("main", "no-edge"):
        assert "response_length/clip_ratio, every step" in failed(reasoning.checks(f, kind))


def test_spearman():
    assert reasoning.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert reasoning.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(reasoning.spearman([1, 2], [1, 2]))


def test_a_run_of_another_task_has_no_picture(tmp_path):
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "kind": "validation", "metrics": {"val-core/gsm8k/acc/mean@1": 0.5}}) + "\n"
    )
    assert reasoning.picture(runs.read(folder)) is None


def test_the_valid_trace_share_is_measured_beside_the_tag_rate(tmp_path):
    """The tag rate counts `<think>`; the valid share counts traces whose every column is right for the
    problem. The synthetic run's traces ("1+2+0=3;" x 3 for 123+210) carry the tag but are wrong: valid 0.
    Half of the last validation's rewritten as the problem's own trace: valid 0.5, the tag unchanged."""
    from tools.tasks import long_addition as T

    run = write_run(tmp_path / "main", rising, lambda s: 0.3 + 0.7 * min(1.0, s / 20))
    f = reasoning.figures(reasoning.picture(runs.read(run)))
    assert f["val_tag_last"] == 1.0 and f["val_valid_trace_last"] == 0.0
    last = run / "validation" / "30.jsonl"
    rows = [json.loads(x) for x in last.read_text().splitlines()]
    for r in rows[:4]:
        r["output"] = T.trace_response(T.parse_problem(r["input"]))
    last.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pic = reasoning.picture(runs.read(run))
    f = reasoning.figures(pic)
    assert f["val_tag_last"] == 1.0 and f["val_valid_trace_last"] == 0.5
    assert "trace tag 1.000, valid trace 0.500" in "\n".join(reasoning.describe(pic))
    assert failed(reasoning.checks(f)) == set()  # the checks read the tag rate (docs/r1-zero.md says so)


def test_bench_zero_prints_the_windows_docs_r1_zero_gives(tmp_path):
    """docs/r1-zero.md's per-window table (the no-edge control) comes from `make bench-zero ARGS='--report
    RUN'`: the window means of the tally's traced / direct accuracy, the trace rate and the length."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_zero", Path(__file__).parents[3] / "bench" / "bench_zero.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    run = write_run(tmp_path / "main", rising, lambda s: 0.3 + 0.7 * min(1.0, s / 20))
    lines = bench.window_lines(runs.read(run))
    # steps 1-5: trace 0.25 + 0.75 s / 20 (mean s 3), length 6 + 20 x that
    assert "| 1-5 | 0.950 | 0.100 | 0.362 | 13.250 |" in lines
    assert "held-out accuracy at step 10, digits [1, 2, 3]: 1.00 / 0.65 / 0.65" in lines
    assert not any(line.startswith("| 41-60") for line in lines)  # a 30-step run has no such window
