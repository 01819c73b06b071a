"""The weights reach the engine (issue 15): after every training step verl hands the Megatron actor's weights
to the vLLM server, and vLLM then generates with them.

`make train` (current stack, the default tiny-cpu recipe, 3 steps) runs with a Ray worker setup hook
(tests/current/handover.py) that only reads what verl already holds for each step's batch: vLLM's log-prob of
every sampled response token (rollout.calculate_log_probs), the Megatron actor's log-prob of the same token
on the same weights (old_log_probs, computed before the update) and the reference model's (the initial
weights, i.e. what the engine would hold had no trained weights been handed over).

- vLLM equals the actor within bf16 tolerance at every step, also after the actor has moved;
- the actor has moved: by step 3 the reference's log-probs are further from vLLM's than the actor's are, by
  more than the bf16 noise, so a hand-over that left the engine on the old weights would fail the first check.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import train_e2e as e2e

pytestmark = [pytest.mark.slow, pytest.mark.upstream, pytest.mark.megatron]
REPO = Path(__file__).resolve().parents[2]
# mean |Δ log-prob| per sampled token, vLLM vs Megatron, both bf16 on the same weights
MEAN_TOL = 0.02


def test_vllm_log_probs_follow_the_actor_after_each_step(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs"
    hook = [
        "++verl.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=tests.current.handover.install",
        f"++verl.ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH={REPO}",
        "++verl.trainer.test_freq=-1",
        "++verl.trainer.val_before_train=false",
        "++verl.trainer.save_freq=-1",
        # the tiny random model earns no reward, so GRPO's advantages are 0: an entropy bonus and a large
        # learning rate make each update move the weights, so that stale weights in the engine would show
        "++verl.actor_rollout_ref.actor.entropy_coeff=0.01",
        "++verl.actor_rollout_ref.actor.optim.lr=0.001",
    ]
    r = e2e.train("current", outputs, "--run", "handover", "--fresh", "--no-plan", *hook, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = outputs / "current" / "handover"
    rows = e2e.metrics(run)
    steps = {x["step"]: x["metrics"] for x in rows if x["kind"] == "train"}
    assert sorted(steps) == [1, 2, 3]
    for step, m in steps.items():
        assert m["handover/tokens"] > 0, m
        assert m["handover/actor_mean_abs"] < MEAN_TOL, (step, m)
    # step 1: the actor has not been updated yet, so actor and reference are the same weights
    assert abs(steps[1]["handover/ref_mean_abs"] - steps[1]["handover/actor_mean_abs"]) < 1e-3, steps[1]
    # step 3: two updates later the old weights no longer explain what vLLM generated
    last = steps[3]
    assert last["handover/ref_mean_abs"] > last["handover/actor_mean_abs"] + MEAN_TOL, last
