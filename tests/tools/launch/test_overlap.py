"""The overlap of generation and training (tools/report/overlap.py, tools/launch/activity.py): the
trainer's phases placed on the wall clock from verl's timings, the rollout's and the trainer's busy time
from the CPU samples, the overlap ratio and the idle fraction, the timeline plot and the report section."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from tools.launch import activity
from tools.report import overlap


def inside(spans, t):
    return any(a < t <= b for a, b in spans)


def write_activity(folder, t0, busy_rollout, busy_trainer, until, dt=0.1):
    rows = []
    t = 0.0
    while t < until:
        t += dt
        rows.append({"t": t0 + t, "dt": dt, "rollout": 0.09 if inside(busy_rollout, t) else 0.0,
                     "trainer": 0.09 if inside(busy_trainer, t) else 0.0})  # fmt: skip
    (folder / "activity-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def steps_metrics(gen):
    return {
        s: {
            "timing_s/step": 2.0,
            "timing_s/gen": g,
            "timing_s/update_actor": 2.0 - g - 0.2,
            "timing_s/update_weights": 0.2,
        }  # fmt: skip
        for s, g in gen.items()
    }


T0 = 1000.0


def test_sync_has_no_overlap(tmp_path):
    # step s runs [10 + 2(s-1), 10 + 2s]: generation its first second, then training
    timeline = {"1": {"start": T0, "steps": {"1": 12.0, "2": 14.0}}}
    write_activity(tmp_path, T0, [(10, 11), (12, 13)], [(11, 12), (13, 14)], 15)
    ov = overlap.analyse(timeline, steps_metrics({1: 1.0, 2: 1.0}), tmp_path, "sync")
    assert [s.name for s in ov.steps[1]] == ["gen", "update_actor", "update_weights"]
    assert ov.steps[2][0].start == pytest.approx(12.0)
    assert ov.overlap_ratio == pytest.approx(0.0, abs=0.06)
    assert ov.trainer_idle == pytest.approx(0.5, abs=0.06)
    assert ov.trainer_wait == pytest.approx(0.5)


def test_separate_async_overlaps(tmp_path):
    # the rollout generates the whole time; the trainer trains almost all the time
    timeline = {"1": {"start": T0, "steps": {"1": 12.0, "2": 14.0}}}
    write_activity(tmp_path, T0, [(10, 14)], [(10.1, 12), (12.1, 14)], 15)
    ov = overlap.analyse(timeline, steps_metrics({1: 0.1, 2: 0.1}), tmp_path, "separate_async")
    assert ov.overlap_ratio > 0.9
    assert ov.trainer_idle < 0.1
    assert "overlap ratio" in ov.line()
    png = overlap.timeline_png(ov, "t")
    assert png[:4] == b"\x89PNG"


def test_the_validation_at_the_last_step_is_not_part_of_it(tmp_path):
    timeline = {"1": {"start": T0, "steps": {"1": 15.0}}}  # the line came after a 3 s validation
    m = steps_metrics({1: 1.0})
    m[1]["timing_s/testing"] = 3.0
    ov = overlap.analyse(timeline, m, tmp_path, "sync")
    assert ov.steps[1][-1].end == pytest.approx(12.0)
    assert ov.overlap_ratio is None and "predates" in ov.notes[0]


def test_report_section_and_roles(tmp_path):
    timeline = {"1": {"start": T0, "steps": {"1": 12.0, "2": 14.0}}}
    write_activity(tmp_path, T0, [(10, 14)], [(10.1, 14)], 15)
    cfg = OmegaConf.create({"verl": {"trainer": {"v1": {"trainer_mode": "separate_async"}}}})
    run = SimpleNamespace(config=cfg, timeline=timeline, steps=steps_metrics({1: 0.1, 2: 0.1}), folder=tmp_path,
                          label="r")  # fmt: skip
    images = {}
    html = overlap.section([run], images)
    assert "Did generation and training overlap" in html and "separate_async" in html
    assert "timeline.png" in images
    assert activity.role_of("VLLM::EngineCore") == "rollout"
    assert activity.role_of("ray::WorkerDict.actor_rollout_ref_update_actor") == "trainer"
    assert activity.role_of("ray::DetachActorWorker") == "trainer"
    assert activity.role_of("raylet") is None


def test_make_train_records_each_roles_cpu(tmp_path):
    """supervise.run_verl samples the run's processes: a process titled as vLLM's engine that computes for
    a second shows up as rollout CPU time in activity-1.jsonl."""
    import io
    import sys

    from tools.launch import supervise

    script = tmp_path / "driver.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "p = subprocess.Popen(['bash', '-c', 'exec -a VLLM::EngineCore %s -c \"import time\\n"
        "t = time.time()\\nwhile time.time() - t < 1.5: pass\"'])\n"
        "p.wait()\n"
        "sys.exit(0)\n".replace("%s", sys.executable)
    )
    rc, _, _ = supervise.run_verl([str(script)], {}, tmp_path, 1, io.StringIO(), (60, 30))
    assert rc == 0
    rows = [json.loads(line) for line in (tmp_path / "activity-1.jsonl").read_text().splitlines()]
    assert sum(r["rollout"] for r in rows) > 0.05, rows[-5:]  # a loaded 2-core machine gives it little
    assert sum(r["trainer"] for r in rows) == 0


def test_a_run_that_stopped_before_any_metrics_is_not_read_from_its_activity(tmp_path):
    """A run folder with only activity-1.jsonl (verl stalled before its first metric) has no metrics: the
    report says so instead of reading the CPU samples as verl's records."""
    from tools.report import runs

    write_activity(tmp_path, T0, [], [], 1)
    with pytest.raises(runs.ReportError, match="no metrics JSONL found"):
        runs.find_metrics(tmp_path)
