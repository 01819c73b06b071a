"""`make train` end to end: the default recipe (tiny DeepSeek-V3, Megatron actor on gloo, HF rollout)
through the patched verl and Ray, then what came out of it. The test that the distribution as a whole
works; CI runs it. Outputs go to a temporary folder (ASCEND_R1_OUTPUTS); the tiny assets are the
checkout's cache (build/tiny), made on first use.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.upstream, pytest.mark.megatron]
REPO = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def _train(outputs: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "ASCEND_R1_OUTPUTS": str(outputs)}
    return subprocess.run(
        [sys.executable, "-m", "tools.launch.train", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_default_make_train_end_to_end(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    first = _train(outputs)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    run = outputs / "published" / "tiny-cpu"
    assert f"run folder {run}" in first.stdout

    # metrics: the asked-for steps, finite losses, validation before training and at the end
    rows = _metrics(run)
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    for r in train:
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "timing_s/step", "perf/throughput"):
            assert math.isfinite(r["metrics"][key]), (r["step"], key)
    assert {r["step"] for r in rows if r["kind"] == "validation"} == {0, 3}
    table = (run / "steps.md").read_text().splitlines()
    assert table[0].startswith("| step | gen s | reshard s | reward s | old_lp s | ref s | update s")
    assert len(table) == 2 + 3

    # plots: non-empty PNGs
    for name in ("reward.png", "response_length.png"):
        data = (run / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 2000, name

    # the checkpoint loads: the actor's torch_dist checkpoint exported by the project's mcore-to-hf
    # (local layer spec names) is a DeepSeek-V3 that transformers loads with every weight present
    ckpt = run / "checkpoints"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    hf = tmp_path / "hf"
    exp = subprocess.run(
        [sys.executable, "-m", "tools.weights", "mcore-to-hf", str(ckpt / "global_step_3/actor/dist_ckpt"),
         str(hf), "--config", str(REPO / "build/tiny/model"), "--layer-spec", "local", "--threads", "1"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert exp.returncode == 0, exp.stderr[-3000:]
    from transformers import DeepseekV3ForCausalLM

    model, info = DeepseekV3ForCausalLM.from_pretrained(hf, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[5, 6, 7, 8]])).logits).all()

    # a second make train resumes from the saved step and continues
    second = _train(outputs)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resuming from the checkpoint" in second.stdout and "global_step_3" in second.stdout
    train = [r for r in _metrics(run) if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert all(r["attempt"] == 2 for r in train[3:])
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "6"
    timeline = json.loads((run / "timeline.json").read_text())
    assert timeline["2"]["resumed_from_step"] == 3


def test_second_train_refuses_and_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    env = {**os.environ, "ASCEND_R1_OUTPUTS": str(outputs)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.launch.train", "--backend", "fsdp"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    seen: set[psutil.Process] = set()
    try:
        deadline = time.time() + 300
        assert proc.stdout is not None
        for line in proc.stdout:
            if "starting Ray" in line:
                break
            assert time.time() < deadline, "verl did not start"
        # a second make train in the same checkout refuses, naming the running one's folder
        other = _train(outputs, "--run", "other", timeout=120)
        assert other.returncode == 2
        assert "another `make train` is running" in other.stderr
        assert str(outputs / "published" / "tiny-cpu-fsdp") in other.stderr
        # let Ray and the workers come up, recording the tree, then Ctrl-C
        t_end = time.time() + 25
        while time.time() < t_end:
            try:
                seen.update(psutil.Process(proc.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                break
            time.sleep(0.5)
        assert len(seen) >= 4, "Ray and verl's workers should be running by now"
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, rest[-3000:]
    assert "stopping verl and Ray" in rest
    alive = [p for p in seen if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [(p.pid, p.name()) for p in alive]


def test_fsdp_backend_end_to_end(tmp_path: Path) -> None:
    """make train BACKEND=fsdp: verl's FSDP2 actor and reference on gloo (the CPU device module, no
    CPU-offload policy for the reference, sdpa attention), same data, reward and checkpoint at the end."""
    outputs = tmp_path / "outputs"
    r = _train(outputs, "--backend", "fsdp")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = outputs / "published" / "tiny-cpu-fsdp"
    train = [x for x in _metrics(run) if x["kind"] == "train"]
    assert [x["step"] for x in train] == [1, 2, 3]
    assert all(math.isfinite(x["metrics"]["actor/pg_loss"]) for x in train)
    assert (run / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
