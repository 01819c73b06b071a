"""`make train` end to end on the current stack: the default recipe (tiny DeepSeek-V3 shaped for vLLM's CPU
MLA, Megatron actor and reference on gloo, verl 0.9.1's server-mode rollout on a real vLLM CPU engine)
through the patched verl and Ray, then what came out of it. CI runs it. Outputs go to a temporary folder
(ASCEND_R1_OUTPUTS); the tiny assets are the checkout's cache (build/tiny-current), made on first use.
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
# vLLM (bf16, its CPU MLA/MoE kernels) against the Megatron actor (bf16, local spec) on the same weights:
# per-token probabilities of the sampled tokens
PROB_TOL = 0.05


def _train(outputs: Path, *args: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    env = {**os.environ, "ASCEND_R1_OUTPUTS": str(outputs), "ASCEND_R1_STACK": "current"}
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
    run = outputs / "current" / "tiny-cpu"
    assert f"run folder {run}" in first.stdout

    # metrics: the asked-for steps, finite losses, validation before training and at the end
    rows = _metrics(run)
    train = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    for r in train:
        for key in ("actor/pg_loss", "actor/kl_loss", "timing_s/step", "perf/throughput"):
            assert math.isfinite(r["metrics"][key]), (r["step"], key)
        # the engine generated on the actor's weights (verl's rollout-vs-actor figure, every step)
        assert r["metrics"]["training/rollout_probs_diff_max"] < PROB_TOL, r["metrics"]
    assert {r["step"] for r in rows if r["kind"] == "validation"} == {0, 3}
    table = (run / "steps.md").read_text().splitlines()
    assert table[0].startswith("| step | gen s | reshard s | reward s | old_lp s | ref s | update s")
    assert len(table) == 2 + 3

    for name in ("reward.png", "response_length.png"):
        data = (run / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 2000, name

    # the checkpoint: the actor's torch_dist checkpoint exported by the project's mcore-to-hf is a
    # DeepSeek-V3 that transformers loads with every weight present
    ckpt = run / "checkpoints"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    dist = next((ckpt / "global_step_3" / "actor").rglob("metadata.json")).parent
    hf = tmp_path / "hf"
    exp = subprocess.run(
        [sys.executable, "-m", "tools.weights", "mcore-to-hf", str(dist), str(hf),
         "--config", str(REPO / "build/tiny-current/model"), "--layer-spec", "local", "--threads", "1"],
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
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "6"


def test_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    env = {**os.environ, "ASCEND_R1_OUTPUTS": str(outputs), "ASCEND_R1_STACK": "current"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.launch.train"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    seen: set[psutil.Process] = set()
    try:
        deadline = time.time() + 900
        assert proc.stdout is not None
        for line in proc.stdout:
            if "starting Ray" in line:
                break
            assert time.time() < deadline, "verl did not start"
        log = outputs / "current" / "tiny-cpu" / "verl.log"
        # the rollout server is starting: Ray, the Megatron workers and vLLM's server actor are up
        while "vLLMHttpServer" not in log.read_text(errors="replace"):
            assert time.time() < deadline and proc.poll() is None, "verl did not reach the vLLM server"
            time.sleep(2)
        t_end = time.time() + 30
        while time.time() < t_end:
            try:
                seen.update(psutil.Process(proc.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                break
            time.sleep(0.5)
        assert len(seen) >= 4, "Ray and verl's workers should be running by now"
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=180)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, rest[-3000:]
    assert "stopping verl and Ray" in rest
    alive = [p for p in seen if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [(p.pid, p.name()) for p in alive]
