"""verl patch `verl-trainer-the-replay-buffer-s-poll-interval-comes-from-the-config` (current stack).

verl 0.9.1's V1 trainers wait for a batch's trajectories (training and validation) by polling their
ReplayBuffer, which sleeps `poll_interval` seconds between checks: 2.0 s, a constructor default that
`PPOTrainer._build_replay_buffer` never passes. Every step's generation is rounded up to it; on this CPU
the tiny run's 0.3 s of generation took 2.0 s. The patch declares `trainer.v1.sampler.poll_interval`
(default 2.0, upstream's value) and hands it to the built-in buffers; a custom sampler keeps its contract.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import upstream_tree

pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module")
def trainer_base(from_tree):
    return from_tree("verl", "verl.trainer.ppo.v1.trainer_base")


def verl_config(*overrides: str):
    """verl's own Megatron trainer config from the tree's yaml (struct mode: an undeclared key is refused)."""
    from hydra import compose, initialize_config_dir

    config_dir = upstream_tree("verl").resolve() / "verl" / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="ppo_megatron_trainer", overrides=list(overrides))


def built_buffer(trainer_base, config, trainer_mode: str):
    """The replay buffer that `PPOTrainer._build_replay_buffer` makes for `config` (the trainer's other
    state is not needed to build one)."""
    trainer = SimpleNamespace(
        config=config,
        trainer_mode=trainer_mode,
        _add_prompts_to_generate=lambda count: None,
        _resolve_filter_groups_metric=lambda: None,
    )
    return trainer_base.PPOTrainer._build_replay_buffer(trainer)


def test_default_is_upstream_s_two_seconds(trainer_base):
    config = verl_config()
    assert config.trainer.v1.sampler.poll_interval == 2.0
    assert built_buffer(trainer_base, config, "sync").poll_interval == 2.0


@pytest.mark.parametrize("trainer_mode", ["sync", "async"])
def test_the_config_sets_the_poll_interval(trainer_base, trainer_mode):
    config = verl_config("trainer.v1.sampler.poll_interval=0.05")
    buffer = built_buffer(trainer_base, config, trainer_mode)
    assert type(buffer) is (
        trainer_base.ReplayBuffer if trainer_mode == "sync" else trainer_base.ReplayBufferAsync
    )
    assert buffer.poll_interval == 0.05
