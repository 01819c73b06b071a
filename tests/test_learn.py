"""The CPU run that learns, as a guard: `make train RECIPE=tiny-learn` in short form must raise held-out
accuracy. The properties that make GRPO work (the advantage's sign, the loss, the hand-over of updated
weights to the rollout, the reward wired to the right answer, the rollout's positions) can all break
without a crash; then the accuracy does not rise, and this test fails. It runs on every stack the recipe
runs on (launch.stacks): published (HF rollout) and current (the vLLM engine in its own server process,
as the default `make train` there).

Short form: the recipe's base model (made on first use in build/learn/<stack>/seed-0, ~80-120 s of one core),
seed 0, 10 GRPO steps (current: 20, see STEPS), validation (8 samples per held-out problem) before training
and after the last step, no checkpoint, no final evaluation. Measured (published, 2026-11-25, load 10-15 from
a parallel CI run): 0.31 -> 0.57 (+0.26) in 211 s with the base model cached; the seed-1 run of the full
recipe rose +0.17 by step 10. With 20 x 8 samples the noise is about 0.05 (one standard deviation of the
difference of two such means); the threshold +0.10 sits between. Run once each with the weight hand-over to
the rollout disabled and with the advantage's sign flipped (docs/training-on-cpu.md, "A run that learns"), it fails. More
checks: the validation before training agrees with the base model's own sampled accuracy (the rollout samples
from the model it was given), the format is kept, and where the rollout returns its own log-probs (current:
vLLM's `calculate_log_probs`), verl's per-step `training/rollout_probs_diff_mean` (mean |p_rollout - p_actor|
over the batch's sampled tokens, the actor on the weights of that step) stays at bf16 noise at every step: the
engine samples from the actor's distribution, so the hand-over reached it. CI runs it on published (about 4
minutes with the base model made afresh); on current, where it took 407 s of CI's hour, it runs with
ASCEND_R1_ALL_TESTS=1 (tests/outside_ci.py), and tests/test_zero.py guards that stack's GRPO in CI with the same
hand-over check on this CPU's native kernels.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import train_e2e as e2e
from tests.conftest import STACK
from tests.outside_ci import outside_ci
from tools.analysis import learning
from tools.recipes.recipe import recipe_stacks, runs_on

# every stack the recipe runs on (launch.stacks): the guard follows the recipe to a stack when it is enabled
pytestmark = [pytest.mark.slow, pytest.mark.upstream, pytest.mark.megatron, pytest.mark.every_stack]
# GRPO steps before the second validation. The current stack's model (MLA heads 32 wide, which AMX_MLA's kernels
# need) learns more slowly in its first steps: seed 0 (base model made afresh, 2026-11-26, AMD EPYC, flags avx2
# avx512f avx512_bf16) rose +0.175 by step 10 in one full run and +0.025 in a short one, one other short run
# passed; by step 20 the full runs rose +0.306 and +0.438 (seeds 0, 1). Published (HF rollout): +0.26 by step 10.
STEPS = {"current": 20}.get(STACK, 10)
MIN_RISE = 0.10  # validation accuracy after STEPS minus before (expected >= +0.2; noise ~ 0.05)
BASE_AGREES = 0.12  # |validation before training - the base model's own sampled accuracy| (noise ~ 0.05)


@outside_ci(
    "on current, tests/test_zero.py guards this stack's GRPO, the weight hand-over and the native kernels; "
    "`make bench-learn` runs the full recipe",
    where=STACK == "current",
)
def test_grpo_raises_held_out_accuracy(tmp_path: Path) -> None:
    if not runs_on("tiny-learn", STACK):
        pytest.skip(
            f"recipe tiny-learn runs on {recipe_stacks('tiny-learn')} (launch.stacks), not on {STACK}"
        )
    outputs = tmp_path / "outputs"
    r = e2e.train(
        STACK, outputs, "--recipe", "tiny-learn", "--fresh", "--run", "guard", f"launch.steps={STEPS}",
        f"verl.trainer.test_freq={STEPS}", "verl.trainer.save_freq=-1", "launch.final_eval=false",
        # the rollout on this machine's own vLLM kernels (tools/cpu_kernels.py; published: HF rollout, no
        # effect): the hand-over check below then holds for the family this CPU is
        "launch.cpu_kernels=native", timeout=1500,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    run = outputs / STACK / "guard"
    c = learning.run_curve(run)
    print(learning.describe(c))  # in the test's output: what the run did
    assert c.key == "val-core/addition/acc/mean@8", c.key
    assert sorted(c.accuracy) == [0, STEPS], c.accuracy
    assert sorted(c.reward) == list(range(1, STEPS + 1)), c.reward
    rows = e2e.metrics(run)
    e2e.check_rollout_follows_actor(run, expected=e2e.rollout_returns_log_probs(STACK))
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
    last_val = next(x for x in rows if x["kind"] == "validation" and x["step"] == STEPS)["metrics"]
    # still answers in the format (measured at step 10: published 0.97, current 0.91; a broken format collapses)
    assert last_val["val-aux/addition/format/mean@8"] >= 0.8, last_val
    assert (run / "learning.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
