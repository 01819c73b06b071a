"""verl patch `verl-megatron-actor-on-policy-old-log-probs...` (docs/design.md §4).

With one PPO epoch and one mini-batch per step the Megatron actor takes the current log-prob,
detached, as the old one: the ratio is exactly 1, so verl's own policy loss reports no clipping and
no KL, whatever numerical noise lies between the stored old log-probs and this forward pass.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from tests.published.patches.trees import import_from_tree

pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module")
def on_policy():
    return import_from_tree("verl", "verl.workers.actor.on_policy")


def _actor_config(**kw):
    cfg = {
        "clip_ratio": 0.2,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.2,
        "clip_ratio_c": 3.0,
        "loss_agg_mode": "token-mean",
        "policy_loss": {"loss_mode": "vanilla"},
        "ppo_epochs": 1,
        "ppo_mini_batch_size": 4,
        "use_kl_loss": False,
        "data_loader_seed": 0,
        "shuffle": False,
    }
    cfg.update(kw)
    return OmegaConf.create(cfg)


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    current = torch.randn(4, 6, generator=g, requires_grad=True)
    # a second forward pass of the same weights: close, but far enough to leave the clip range
    stored = (current + 0.5 * torch.randn(4, 6, generator=g)).detach()
    advantages = torch.randn(4, 6, generator=g)
    mask = torch.ones(4, 6, dtype=torch.bool)
    return current, stored, advantages, mask


@pytest.mark.parametrize(
    ("epochs", "batch", "mini", "expected"),
    [(1, 4, 4, True), (1, 3, 4, True), (1, 8, 4, False), (2, 4, 4, False), (1, 5, 4, False)],
)
def test_single_update_rule(on_policy, epochs, batch, mini, expected):
    assert on_policy.is_single_update(epochs, batch, mini) is expected


def test_on_policy_selection_is_the_current_value_without_grad(on_policy):
    current, stored, _, _ = _batch()
    old = on_policy.select_old_log_prob(stored, current, on_policy=True)
    assert torch.equal(old, current)
    assert not old.requires_grad and old.grad_fn is None
    assert old.data_ptr() == current.data_ptr()  # a detached view, no copy


def test_fallback_keeps_the_stored_value(on_policy):
    current, stored, _, _ = _batch()
    assert on_policy.select_old_log_prob(stored, current, on_policy=False) is stored
    with pytest.raises(ValueError, match="shape"):
        on_policy.select_old_log_prob(stored[:, :3], current, on_policy=True)


def test_verl_policy_loss_reports_no_clipping_on_policy(on_policy):
    core_algos = import_from_tree("verl", "verl.trainer.ppo.core_algos")
    loss_fn = core_algos.get_policy_loss_fn("vanilla")
    config = _actor_config()
    current, stored, advantages, mask = _batch()

    def run(on):
        old = on_policy.select_old_log_prob(stored, current, on_policy=on)
        return loss_fn(
            old_log_prob=old,
            log_prob=current,
            advantages=advantages,
            response_mask=mask,
            loss_agg_mode="token-mean",
            config=config,
        )

    loss, clipfrac, ppo_kl, _ = run(True)
    assert clipfrac.item() == 0.0 and ppo_kl.item() == 0.0
    loss.backward()
    # ratio 1: d(loss)/d(log_prob) = -advantages / n_tokens, the plain policy gradient
    assert torch.allclose(current.grad, -advantages / mask.sum())
    # the scenario is meaningful: with the stored values verl clips and sees a KL
    _, clipfrac_stored, ppo_kl_stored, _ = run(False)
    assert clipfrac_stored.item() > 0.1 and abs(ppo_kl_stored.item()) > 0


@pytest.mark.parametrize(("batch", "expected"), [(4, True), (8, False)])
def test_megatron_actor_decides_per_step(batch, expected):
    """The hook: make_minibatch_iterator records whether this step is one update."""
    actor_mod = import_from_tree("verl", "verl.workers.actor.megatron_actor")
    from verl import DataProto

    actor = object.__new__(actor_mod.MegatronPPOActor)
    actor.config = _actor_config(ppo_mini_batch_size=4)
    n, t = batch, 6
    data = DataProto.from_dict(
        {
            "responses": torch.zeros(n, t, dtype=torch.long),
            "input_ids": torch.zeros(n, 2 * t, dtype=torch.long),
            "attention_mask": torch.ones(n, 2 * t, dtype=torch.long),
            "response_mask": torch.ones(n, t, dtype=torch.long),
            "position_ids": torch.arange(2 * t).expand(n, -1),
            "old_log_probs": torch.zeros(n, t),
            "advantages": torch.zeros(n, t),
        }
    )
    batches = list(actor.make_minibatch_iterator(data))
    assert len(batches) == (1 if expected else 2)
    assert actor.on_policy is expected
