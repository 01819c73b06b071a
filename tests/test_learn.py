"""The CPU run that learns, as a guard: `make train RECIPE=tiny-learn` in short form must raise held-out
accuracy. The properties that make GRPO work (the advantage's sign, the loss, the hand-over of updated
weights to the rollout, the reward wired to the right answer, the rollout's positions) can all break
without a crash; then the accuracy does not rise, and this test fails.

Short form: the recipe's base model (made on first use in build/learn/<stack>/seed-0, ~100 s of one core),
seed 0, 10 GRPO steps, validation (8 samples per held-out problem) before training and after step 10, no
checkpoint. The issue's hand-made probe rose about +0.2 in 10 steps; with 20 x 8 samples the noise is about
0.05 (one standard deviation of the difference of two such means); the threshold +0.10 sits between. The
recipe as it is today does not reach it (see the xfail marker): it is xfail until it does. Two more checks: the validation before training agrees with the base
model's own sampled accuracy (the rollout samples from the model it was given), and the format is kept.
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


@pytest.mark.skipif(
    os.environ.get("ASCEND_R1_LEARN_GUARD") != "1",
    reason="issue 16 open: the recipe does not learn yet (xfail below), and the run costs 5-20 min of CI; "
    "ASCEND_R1_LEARN_GUARD=1 runs it (make bench-learn measures the figures)",
)
@pytest.mark.xfail(
    strict=True,
    reason="issue 16 open: with the base model the recipe makes today, GRPO does not raise held-out accuracy "
    "by +0.10 in 10 steps (seed 0: lr 1e-3 0.319 -> 0.212; lr 3e-4 0.319 -> 0.350); strict: it fails the "
    "suite as soon as the run learns, then remove this marker",
)
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
