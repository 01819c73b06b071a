"""`make train RECIPE=tiny-cpu-parallel` on the current stack, the weights-reach-the-engine check under the
parallel layout: the Megatron actor at PP2 x EP2 on 4 gloo ranks hands its
weights, every step, to two vLLM replicas each with tensor parallelism 2 and expert parallelism (experts 4
of 8 a rank), and the engines then generate on them.

The check is tests/current/test_train_e2e.py's (the same large updates, MOVING, and KL figure): verl's
`training/rollout_probs_diff_max` (max |p_vLLM - p_actor| over each step's sampled tokens, the engines
against the actor's old log-probs on the same weights) within bf16 noise at every step (HANDOVER_TOL, this
layout's), and the actor's low_var_kl to the reference (the initial weights) near 0 at step 1 and large at
step 2, after one update: an engine left on the initial weights, or given a wrong share of them (a stage's
layers or an expert rank's experts gathered twice or dropped), would be that far from the actor. That
module's docstring gives the arithmetic.

As cheap as the check allows (CI): 2 steps, no validation, no checkpoint (tests/current/parallel/
test_layouts.py covers the parallel checkpoint, tests/current/test_train_e2e.py the run's own outputs):
310 s at load 0.4-9 on this 2-core machine, the tiny assets included (the checkout's cache,
build/tiny-parallel-current, made on first use); 146 s with them and make's bytecode cache (build/pycache)
already there, 2026-11-25; peak process-tree PSS 12.0 GiB (with 256 MiB of vLLM KV
cache a worker then; 32 MiB since).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import train_e2e as e2e
from tests.current.test_train_e2e import KL_AT_START, KL_MOVED, MOVING, STACK

pytestmark = [pytest.mark.slow, pytest.mark.upstream, pytest.mark.megatron]
RECIPE = "tiny-cpu-parallel"
# max |p_vLLM - p_actor| per sampled token, vLLM TP2 + EP (bf16, its sums split over two ranks) against the
# Megatron actor at PP2 x EP2 (bf16), measured 2026-11-25: 9.3e-5, 2.3e-5 (this test, steps 1-2); 6.2e-5,
# 2.6e-5, 3.4e-5 and 6.2e-5, 1.3e-4, 2.8e-5 (two make bench-train runs, steps 1-3): above the single-rank
# run's 1e-5 to 6e-5 and its bound 1e-4, so 3x the largest seen. A stale engine would be about 2e-3 off
# (tests/current/test_train_e2e.py's docstring), 5x above this.
HANDOVER_TOL = 4e-4
CHEAP = (
    "launch.steps=2",
    "verl.trainer.val_before_train=false",
    "verl.trainer.test_freq=-1",  # no validation at the end
    "verl.trainer.save_freq=-1",  # no checkpoint
)


def test_parallel_layout_hands_the_weights_to_the_engines(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    run = outputs / STACK / RECIPE
    r = e2e.train(STACK, outputs, "--recipe", RECIPE, *MOVING, *CHEAP, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    steps = {row["step"]: row["metrics"] for row in e2e.metrics(run) if row["kind"] == "train"}
    assert sorted(steps) == [1, 2], sorted(steps)
    for step, m in steps.items():
        assert m["training/rollout_probs_diff_valid"] == 1, (step, m)
        assert m["training/rollout_probs_diff_max"] < HANDOVER_TOL, (step, m)
    assert steps[1]["actor/kl_loss"] < KL_AT_START, steps[1]  # the actor is still the initial weights
    assert steps[2]["actor/kl_loss"] > KL_MOVED, steps[2]  # one large update later
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())
