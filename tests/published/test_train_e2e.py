"""`make train` end to end: the default recipe (tiny DeepSeek-V3, Megatron actor on gloo, HF rollout)
through the patched verl and Ray, then what came out of it. The test that the distribution as a whole
works; CI runs it. Outputs go to a temporary folder (ASCEND_R1_OUTPUTS); the tiny assets are the
checkout's cache (build/tiny), made on first use.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from tests import train_e2e as e2e

pytestmark = [pytest.mark.slow, pytest.mark.upstream, pytest.mark.megatron]
STACK = "published"


def _train(outputs: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return e2e.train(STACK, outputs, *args, timeout=timeout)


def test_default_make_train_end_to_end(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    run = outputs / STACK / "tiny-cpu"
    e2e.check_first_run(
        _train(outputs),
        run,
        ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "timing_s/step", "perf/throughput"),
    )

    # the checkpoint loads: the actor's torch_dist checkpoint exported by the project's mcore-to-hf
    # (local layer spec names) is a DeepSeek-V3 that transformers loads with every weight present
    ckpt = run / "checkpoints"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    e2e.check_exported_checkpoint(
        ckpt / "global_step_3/actor/dist_ckpt", tmp_path / "hf", e2e.REPO / "build/tiny/model"
    )

    # a second make train resumes from the saved step and continues
    train = e2e.check_resumed(_train(outputs), run)
    assert all(r["attempt"] == 2 for r in train[3:])
    timeline = json.loads((run / "timeline.json").read_text())
    assert timeline["2"]["resumed_from_step"] == 3


def test_second_train_refuses_and_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"

    def second_train_refuses(proc: subprocess.Popen, deadline: float) -> None:
        # a second make train in the same checkout refuses, naming the running one's folder
        other = _train(outputs, "--run", "other", timeout=120)
        assert other.returncode == 2
        assert "another `make train` is running" in other.stderr
        assert str(outputs / STACK / "tiny-cpu-fsdp") in other.stderr
        # then Ray and the workers come up, the tree is recorded, and Ctrl-C

    e2e.check_ctrl_c_leaves_nothing(
        STACK,
        outputs,
        ["--backend", "fsdp"],
        start_s=300,
        settle_s=25,
        stop_s=120,
        when_started=second_train_refuses,
    )


def test_fsdp_backend_end_to_end(tmp_path: Path) -> None:
    """make train BACKEND=fsdp: verl's FSDP2 actor and reference on gloo (the CPU device module, no
    CPU-offload policy for the reference, sdpa attention), same data, reward and checkpoint at the end."""
    outputs = tmp_path / "outputs"
    r = _train(outputs, "--backend", "fsdp")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = outputs / STACK / "tiny-cpu-fsdp"
    train = [x for x in e2e.metrics(run) if x["kind"] == "train"]
    assert [x["step"] for x in train] == [1, 2, 3]
    assert all(math.isfinite(x["metrics"]["actor/pg_loss"]) for x in train)
    assert (run / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
