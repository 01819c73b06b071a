"""The CPU run that learns, as a guard: `make train RECIPE=tiny-learn` in short form must raise held-out
accuracy. The properties that make GRPO work (the advantage's sign, the loss, the hand-over of updated
weights to the rollout, the reward wired to the right answer, the rollout's positions) can all break
without a crash; then the accuracy does not rise, and this test fails.

Short form: the recipe's base model (made on first use in build/learn/<stack>/seed-0, ~80-120 s of one core),
seed 0, 10 GRPO steps, validation (8 samples per held-out problem) before training and after step 10, no
checkpoint, no final evaluation. Measured (published, 2026-11-25, load 10-15 from a parallel CI run): 0.31 ->
0.57 (+0.26) in 211 s with the base model cached; the seed-1 run of the full recipe rose +0.17 by step 10. With
20 x 8 samples the noise is about 0.05 (one standard deviation of the difference of two such means); the
threshold +0.10 sits between. Run once each with the weight hand-over to the rollout disabled and with the
advantage's sign flipped (README, "A run that learns"), it fails. Two more checks: the validation before
training agrees with the base model's own sampled accuracy (the rollout samples from the model it was given),
and the format is kept. CI runs it (about 5 minutes with the base model made afresh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import STACK
from tools.launch import learning
from tools.launch.recipe import recipe_stacks, runs_on

# every stack the recipe runs on (launch.stacks): the guard follows the recipe to a stack when it is enabled
pytestmark = [pytest.mark.slow, pytest.mark.upstream, pytest.mark.megatron, pytest.mark.every_stack]
REPO = Path(__file__).resolve().parents[1]
STEPS = 10
MIN_RISE = 0.10  # validation accuracy after STEPS minus before (expected ~ +0.2; noise ~ 0.05)
BASE_AGREES = 0.12  # |validation before training - the base model's own sampled accuracy| (noise ~ 0.05)


def _train(outputs: Path, *args: str, timeout: int = 1500) -> subprocess.CompletedProcess:
    env = {**os.environ, "ASCEND_R1_OUTPUTS": str(outputs)}
    return subprocess.run(
        [sys.executable, "-m", "tools.launch.train", "--recipe", "tiny-learn", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_grpo_raises_held_out_accuracy(tmp_path: Path) -> None:
    if not runs_on("tiny-learn", STACK):
        pytest.skip(
            f"recipe tiny-learn runs on {recipe_stacks('tiny-learn')} (launch.stacks), not on {STACK}"
        )
    outputs = tmp_path / "outputs"
    r = _train(
        outputs, "--fresh", "--run", "guard", f"launch.steps={STEPS}", f"verl.trainer.test_freq={STEPS}",
        "verl.trainer.save_freq=-1", "launch.final_eval=false",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    run = outputs / STACK / "guard"
    c = learning.run_curve(run)
    print(learning.describe(c))  # in the test's output: what the run did
    assert c.key == "val-core/addition/acc/mean@8", c.key
    assert sorted(c.accuracy) == [0, STEPS], c.accuracy
    assert sorted(c.reward) == list(range(1, STEPS + 1)), c.reward
    base = json.loads((run / "base_model.json").read_text())["held_out"]
    before, after = c.accuracy[0], c.accuracy[STEPS]
    assert abs(before - base["sampled_acc"]) <= BASE_AGREES, (
        f"the rollout's accuracy before training ({before:.3f}) is not the base model's sampled accuracy "
        f"({base['sampled_acc']:.3f}): the rollout does not sample from the model it was given"
    )
    assert after - before >= MIN_RISE, (
        f"GRPO did not raise held-out accuracy: {before:.3f} -> {after:.3f} in {STEPS} steps "
        f"(want >= +{MIN_RISE}); {learning.describe(c)}"
    )
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    last_val = next(x for x in rows if x["kind"] == "validation" and x["step"] == STEPS)["metrics"]
    assert last_val["val-aux/addition/format/mean@8"] >= 0.9, last_val  # still answers in the format
    assert (run / "learning.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
