"""verl patch `verl-trainer-separate_async-starts-with-standalone-rollout-replicas-only` (current stack).

verl 0.9.1's `separate_async` trainer with `actor_rollout_ref.hybrid_engine=false` (the rollout served by
its standalone pool only, recipes/mode/separate_async.yaml) logs a line at the end of `_setup` with
`logger.info(..., flush=True)`: Python's logging takes no `flush`, so every such run died before its
first step with `TypeError: Logger._log() got an unexpected keyword argument 'flush'` (found through
`make train ARGS='mode=separate_async'` on CPU). The test runs `_setup`'s own code with the parts that
start Ray actors replaced by fakes.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module")
def sep(from_tree):
    return from_tree("verl", "verl.trainer.ppo.v1.trainer_separate_async")


def test_setup_without_hybrid_replicas(sep, monkeypatch):
    replicas = [object(), object()]
    standalone = SimpleNamespace(get_replicas=lambda: replicas, server_addresses=[])
    created = {}
    monkeypatch.setattr(sep.PPOTrainer, "_setup", lambda self: None)  # the base: workers, hybrid replicas
    monkeypatch.setattr(sep.LLMServerManager, "create", classmethod(lambda cls, **kw: standalone))
    monkeypatch.setattr(sep, "omega_conf_to_dataclass", lambda cfg: cfg)
    monkeypatch.setattr(
        sep, "CheckpointEngineManager", lambda **kw: created.setdefault("manager", SimpleNamespace(**kw))
    )
    trainer = object.__new__(sep.PPOTrainerSeparateAsync)
    trainer._enable_hybrid_replicas = False
    trainer.config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"prometheus": {"enable": False}, "checkpoint_engine": {}}}}
    )
    trainer.llm_server_manager = SimpleNamespace(rollout_replicas=[])
    trainer.actor_rollout_wg = "actor"

    trainer._setup()

    assert trainer.current_mode == sep.HybridEngineMode.TRAINER
    assert created["manager"].replicas is replicas
