"""`make train` end to end on the current stack: the default recipe (tiny DeepSeek-V3 shaped for vLLM's CPU
MLA, Megatron actor and reference on gloo, verl 0.9.1's server-mode rollout on a real vLLM CPU engine)
through the patched verl and Ray, then what came out of it. CI runs it. Outputs go to a temporary folder
(ASCEND_R1_OUTPUTS); the tiny assets are the checkout's cache (build/tiny-current), made on first use.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests import train_e2e as e2e

pytestmark = [pytest.mark.slow, pytest.mark.upstream, pytest.mark.megatron]
STACK = "current"
# vLLM (bf16, its CPU MLA/MoE kernels) against the Megatron actor (bf16, local spec) on the same weights:
# per-token probabilities of the sampled tokens
PROB_TOL = 0.05


def test_default_make_train_end_to_end(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    run = outputs / STACK / "tiny-cpu"
    train = e2e.check_first_run(
        e2e.train(STACK, outputs, timeout=1500),
        run,
        ("actor/pg_loss", "actor/kl_loss", "timing_s/step", "perf/throughput"),
    )
    for r in train:
        # the engine generated on the actor's weights (verl's rollout-vs-actor figure, every step)
        assert r["metrics"]["training/rollout_probs_diff_max"] < PROB_TOL, r["metrics"]

    # the checkpoint: the actor's torch_dist checkpoint exported by the project's mcore-to-hf is a
    # DeepSeek-V3 that transformers loads with every weight present
    ckpt = run / "checkpoints"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    dist = next((ckpt / "global_step_3" / "actor").rglob("metadata.json")).parent
    e2e.check_exported_checkpoint(dist, tmp_path / "hf", e2e.REPO / "build/tiny-current/model")

    # a second make train resumes from the saved step and continues
    e2e.check_resumed(e2e.train(STACK, outputs, timeout=1500), run)


def test_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"

    def vllm_server_starting(proc: subprocess.Popen, deadline: float) -> None:
        log = outputs / STACK / "tiny-cpu" / "verl.log"
        # the rollout server is starting: Ray, the Megatron workers and vLLM's server actor are up
        while "vLLMHttpServer" not in log.read_text(errors="replace"):
            assert time.time() < deadline and proc.poll() is None, "verl did not reach the vLLM server"
            time.sleep(2)

    e2e.check_ctrl_c_leaves_nothing(
        STACK, outputs, [], start_s=900, settle_s=30, stop_s=180, when_started=vllm_server_starting
    )
