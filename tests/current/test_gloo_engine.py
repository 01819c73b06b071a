"""tools/verl_plugins/gloo_engine.py: separate_async's CPU weight sync, through verl 0.9.1's own engine interface.

One sender (the actor's rank 0), one non-sending actor rank (it walks the weight generator and drops it)
and two rollout ranks run verl's protocol (prepare -> build_topology -> init_process_group -> send/receive
-> finalize) in threads over real gloo groups. After each of three syncs, with the actor's weights changed
in between, every rollout rank holds exactly the actor's tensors (names, dtypes, shapes, bytes): the same
health signal as `training/rollout_probs_diff_*` in a run, here bit for bit. The weights mix bf16 and
fp32, odd lengths (unaligned offsets in a bucket) and a tensor larger than a bucket (chunked).
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module")
def engine_mod():
    import tools.verl_plugins.gloo_engine as mod  # imports verl.checkpoint_engine (the current stack's verl)

    return mod


def actor_weights(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {
        "model.embed_tokens.weight": torch.randn(37, 16, generator=g).to(torch.bfloat16),  # 592 elements
        "model.layers.0.mlp.gate.e_score_correction_bias": torch.randn(7, generator=g),  # fp32 after odd bf16
        "model.layers.0.self_attn.q_a_layernorm.weight": torch.randn(5, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.experts.0.down_proj.weight": torch.randn(64, 33, generator=g),  # 8448 B > bucket
        "lm_head.weight": torch.randn(37, 16, generator=g).to(torch.bfloat16),
    }


BUCKET = 4096


def run_sync(mod, weights: dict[str, torch.Tensor], actor_ranks: int = 2, rollout_ranks: int = 2):
    """verl's CheckpointEngineManager.update_weights, with threads for the Ray workers."""
    actors = [mod.GlooCheckpointEngine(bucket_size=BUCKET, is_master=i == 0) for i in range(actor_ranks)]
    rollouts = [mod.GlooCheckpointEngine(bucket_size=BUCKET) for _ in range(rollout_ranks)]
    metadata = [e.prepare() for e in actors + rollouts]
    actor_kw, rollout_kw = mod.GlooCheckpointEngine.build_topology(actor_ranks, rollout_ranks, metadata)
    received: list[dict[str, torch.Tensor]] = [{} for _ in rollouts]
    errors: list[BaseException] = []
    walked = [0] * actor_ranks

    def actor(i: int) -> None:
        try:
            e = actors[i]
            e.init_process_group(**{k: v[i] for k, v in actor_kw.items()})

            def gen():
                for name, t in weights.items():
                    walked[i] += 1
                    yield name, t

            asyncio.run(e.send_weights(gen()))
            e.finalize()
        except BaseException as ex:  # noqa: BLE001 - reported by the test
            errors.append(ex)

    def rollout(j: int) -> None:
        try:
            e = rollouts[j]
            e.init_process_group(**{k: v[j] for k, v in rollout_kw.items()})

            async def consume():
                async for name, t in e.receive_weights():
                    received[j][name] = t.clone()

            asyncio.run(consume())
            e.finalize()
        except BaseException as ex:  # noqa: BLE001
            errors.append(ex)

    threads = [threading.Thread(target=actor, args=(i,)) for i in range(actor_ranks)]
    threads += [threading.Thread(target=rollout, args=(j,)) for j in range(rollout_ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a sync hung"
    assert not errors, errors
    return received, walked, actors[0].last_sync


def test_registered_in_verls_registry(engine_mod):
    from verl.checkpoint_engine import CheckpointEngineRegistry

    assert CheckpointEngineRegistry.get("gloo") is engine_mod.GlooCheckpointEngine


def test_rollout_weights_equal_the_actors_after_each_sync(engine_mod):
    for step in range(3):
        weights = actor_weights(step)
        received, walked, stats = run_sync(engine_mod, weights)
        for got in received:
            assert list(got) == list(weights), "names or order differ"
            for name, t in weights.items():
                assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
                assert torch.equal(
                    got[name].view(torch.uint8), t.contiguous().view(torch.uint8)
                ), f"sync {step}: {name} differs from the actor's"
        # the non-sending actor rank walked the generator (its gathers are collective in a real actor)
        assert walked == [len(weights)] * 2
        assert stats["bytes"] == sum(t.nbytes for t in weights.values())
        assert stats["buckets"] >= 4  # 8448 B of one tensor alone needs three 4 KiB buckets
        if step:
            assert not torch.equal(
                actor_weights(step)["lm_head.weight"], actor_weights(step - 1)["lm_head.weight"]
            )


def test_topology_has_one_sender(engine_mod):
    m = engine_mod.MasterAddress("127.0.0.1", 1)
    actor, rollout = engine_mod.GlooCheckpointEngine.build_topology(4, 3, [m] + [None] * 6)
    assert actor["rank"] == [0, -1, -1, -1]
    assert rollout["rank"] == [1, 2, 3]
    assert set(actor["world_size"] + rollout["world_size"]) == {4}
    with pytest.raises(RuntimeError, match="is_master"):
        engine_mod.GlooCheckpointEngine.build_topology(1, 1, [None, None])


def test_the_store_listens_from_prepare_on(engine_mod):
    """The address actor rank 0 reports is already being listened on: a port picked free and bound only at
    init_process_group could be taken in between (EADDRINUSE in a separate_async run on CPU)."""
    import socket

    master = engine_mod.GlooCheckpointEngine(bucket_size=BUCKET, is_master=True)
    address = master.prepare()
    with socket.create_connection((address.host, address.port), timeout=5):
        pass
    master.finalize()
    with pytest.raises(RuntimeError, match="before prepare"):
        engine_mod.GlooCheckpointEngine(bucket_size=BUCKET, is_master=True).init_process_group(0, 2, address)
