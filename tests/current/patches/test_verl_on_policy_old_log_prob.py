"""verl patch `verl-losses-on-policy-old-log-probs...` (current stack; ported from the published Megatron
actor patch, docs/design.md §4).

With one epoch over one mini-batch, verl 0.9.1's TrainingWorker marks the mini-batch on-policy and
`ppo_loss` (shared by the FSDP and Megatron engines) takes the current log-prob, detached, as the old one:
the ratio is exactly 1, so verl's own policy loss reports no clipping and no KL whatever numerical noise
lies between the stored old log-probs and this forward pass. Bypass mode keeps the rollout's log-probs,
under the `bypass_mode` loss and under V1's trainer, which flags them to the worker.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module")
def verl(from_tree):
    return from_tree("verl", "verl.workers.utils.losses")


def actor_config(loss_mode: str = "vanilla"):
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    return ActorConfig(
        strategy="megatron",
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=4,
        rollout_n=1,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
    )


def batch(on_policy: bool | None, seed: int = 0):
    """A padded batch of 4 prompts x 3 tokens and responses x 6 tokens: the model's log-probs (flat, one
    value per token, left-shifted by one as verl expects) and stored old log-probs half a nat away."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    b, p, r = 4, 3, 6
    g = torch.Generator().manual_seed(seed)
    current = torch.randn(b, r, generator=g)
    flat = torch.zeros(b, p + r)
    flat[:, p - 1 : p + r - 1] = current
    flat = flat.reshape(-1).requires_grad_(True)
    stored = current + 0.5 * torch.randn(b, r, generator=g)
    advantages = torch.randn(b, r, generator=g)
    td = TensorDict(
        {
            "prompts": torch.ones(b, p, dtype=torch.long),
            "responses": torch.ones(b, r, dtype=torch.long),
            "attention_mask": torch.ones(b, p + r, dtype=torch.long),
            "response_mask": torch.ones(b, r, dtype=torch.long),
            "old_log_probs": stored,
            "advantages": advantages,
        },
        batch_size=[b],
    )
    tu.assign_non_tensor(td, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    if on_policy is not None:
        tu.assign_non_tensor(td, on_policy=on_policy)
    return flat, advantages, td


def metric(metrics, key: str) -> float:
    return float(sum(float(v) for v in metrics[key].values))


def test_on_policy_step_has_ratio_one_in_verls_own_loss(verl):
    flat, advantages, td = batch(on_policy=True)
    loss, metrics = verl.ppo_loss(actor_config(), {"log_probs": flat}, td)
    assert metric(metrics, "actor/pg_clipfrac") == 0.0 and metric(metrics, "actor/ppo_kl") == 0.0
    loss.backward()
    # ratio 1: d(loss)/d(log_prob) = -advantage / n_tokens, the plain policy gradient, at the response tokens
    grad = flat.grad.reshape(4, 9)[:, 2:8]
    assert torch.allclose(grad, -advantages / advantages.numel())


@pytest.mark.parametrize(
    ("on_policy", "loss_mode"), [(None, "vanilla"), (False, "vanilla"), (True, "bypass_mode")]
)
def test_otherwise_the_stored_old_log_probs_count(verl, on_policy, loss_mode, monkeypatch):
    """No flag, a multi-update step, or bypass mode (its old log-probs are the rollout's, on purpose): the
    policy loss gets the stored old log-probs, and vanilla PPO then clips."""
    flat, _, td = batch(on_policy=on_policy)
    stored = td["old_log_probs"].clone()
    seen = {}
    real = verl.get_policy_loss_fn

    def spy(mode):
        def fn(**kw):  # the bypass loss needs rollout-correction settings: vanilla's numbers suffice here
            seen["old"] = kw["old_log_prob"]
            return real("vanilla")(**{**kw, "config": actor_config()})

        return fn

    monkeypatch.setattr(verl, "get_policy_loss_fn", spy)
    _, metrics = verl.ppo_loss(actor_config(loss_mode), {"log_probs": flat}, td)
    assert torch.equal(seen["old"], stored)
    assert metric(metrics, "actor/pg_clipfrac") > 0.1 and abs(metric(metrics, "actor/ppo_kl")) > 0


def test_selection_refuses_mismatched_shapes(verl):
    stored = torch.zeros(2, 3)
    assert verl.select_old_log_prob(stored, torch.ones(2, 3), on_policy=False) is stored
    with pytest.raises(ValueError, match="shape"):
        verl.select_old_log_prob(stored, torch.ones(2, 4), on_policy=True)


def run_train_mini_batch(rows: int, epochs: int, **flags) -> list:
    """TrainingWorker.train_mini_batch over `rows` rows in mini-batches of 4, with an engine that trains
    nothing: the `on_policy` flag of each mini-batch it hands to train_batch."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers import engine_workers

    seen = []
    engine = SimpleNamespace(
        get_data_parallel_size=lambda: 1,
        get_data_parallel_rank=lambda: 0,
        get_data_parallel_group=lambda: None,
        train_mode=lambda **kw: contextlib.nullcontext(),
        is_mp_src_rank_with_outputs=lambda: False,
    )
    worker = object.__new__(engine_workers.TrainingWorker)
    worker.engine = engine
    worker.profiler = SimpleNamespace(step=lambda: None)
    worker.train_batch = lambda td: seen.append(tu.get(td, key="on_policy")) or {}
    td = TensorDict({"advantages": torch.zeros(rows, 2)}, batch_size=[rows])
    tu.assign_non_tensor(
        td, mini_batch_size=4, epochs=epochs, seed=0, dataloader_kwargs={"shuffle": False}, **flags
    )
    train = getattr(
        engine_workers.TrainingWorker.train_mini_batch,
        "__wrapped__",
        engine_workers.TrainingWorker.train_mini_batch,
    )
    train(worker, td)
    return seen


@pytest.mark.parametrize(
    ("rows", "epochs", "expected"), [(4, 1, [True]), (8, 1, [False, False]), (4, 2, [False, False])]
)
def test_training_worker_marks_single_update_steps(verl, rows, epochs, expected):
    """The hook: TrainingWorker.train_mini_batch flags the mini-batch when the step is one update."""
    assert run_train_mini_batch(rows, epochs) == expected


def test_training_worker_leaves_the_rollouts_log_probs_to_bypass_steps(verl):
    """V1's bypass keeps the configured loss and stores the rollout's log-probs as old_log_probs: a
    one-update step flagged `old_log_probs_from_rollout` is not on-policy (a one-step-stale separate_async
    run otherwise trains with ratio 1 and does not learn)."""
    assert run_train_mini_batch(rows=4, epochs=1, old_log_probs_from_rollout=True) == [False]


@pytest.mark.parametrize("bypass", [True, False])
@pytest.mark.parametrize(
    "mode",
    [
        "trainer_sync.PPOTrainerSync",
        "trainer_colocate_async.PPOTrainerColocateAsync",
        "trainer_separate_async.PPOTrainerSeparateAsync",
    ],
)
def test_v1_trainer_tells_the_worker_when_old_log_probs_are_the_rollouts(verl, mode, bypass):
    import importlib

    from omegaconf import OmegaConf

    module, name = mode.split(".")
    trainer_class = getattr(importlib.import_module(f"verl.trainer.ppo.v1.{module}"), name)

    config = OmegaConf.create(
        {
            "algorithm": {"rollout_correction": {"bypass_mode": bypass}},
            "actor_rollout_ref": {
                "actor": {
                    "ppo_mini_batch_size": 2,
                    "calculate_entropy": False,
                    "entropy_coeff": 0.0,
                    "ppo_epochs": 1,
                    "data_loader_seed": 0,
                    "shuffle": False,
                },
                "rollout": {"n": 2, "temperature": 1.0},
            },
        }
    )
    sent = []
    trainer = object.__new__(trainer_class)
    trainer.config = config
    trainer.actor_rollout_wg = SimpleNamespace(
        update_actor=lambda batch: sent.append(dict(batch.extra_info)) or {"metrics": {"mfu": [0.0]}}
    )
    trainer._update_actor(SimpleNamespace(extra_info={}), metrics={})
    assert sent[0]["old_log_probs_from_rollout"] is bypass
