"""tools/routing/replay_cost.py: the bytes routing replay carries, and the planner printing them."""

from __future__ import annotations

import pytest

from tools.routing.replay_cost import ReplayCost

pytestmark = pytest.mark.every_stack


def small() -> ReplayCost:
    return ReplayCost(
        samples=8, seq=100, layers=3, top_k=2, n_experts=8, actor_dp=2, ranks_per_dp_group=4, micro_batch=2,
        max_num_batched_tokens=50, kv_slots_per_engine=1000, engines_per_node=4, host_bw=1e9, network_bw=1e8,
    )  # fmt: skip


def test_bytes_where_they_live():
    c = small()
    assert c.ids_per_token == 6
    assert c.step_bytes == 8 * 100 * 6 * 2  # int16 in verl's batch
    assert c.actor_rank_bytes == 4 * 100 * 6 * 2
    assert c.micro_batch_device_bytes == 2 * 100 * 6 * 2
    assert c.engine_device_bytes == 50 * 6 * 4  # vLLM's int32 capture buffer
    assert c.engine_slot_bytes == 1000 * 6 * 1  # uint8 for <= 256 experts
    assert c.world == 8 and c.driver_send_bytes == c.actor_rank_bytes * 8
    assert c.host_to_device_s == pytest.approx(2 * 4800 / 1e9)
    assert c.handover_s == pytest.approx(2 * 4800 * 8 / 1e8)


def test_more_than_256_experts_take_two_bytes_a_slot_id():
    c = ReplayCost(**{**small().__dict__, "n_experts": 384})
    assert c.engine_slot_bytes == 1000 * 6 * 2


def test_make_plan_prints_the_cost_only_when_routing_replay_is_on():
    """correction=auto (the default) is R3 on the current stack; correction=none has nothing to carry."""
    from tools.plan import plan

    off = plan(
        "deepseek-v3-671b-a3", ["correction=none"], check_machine=False, stack="current", modes_too=False
    )
    assert not [r for r in off.results if r.group == "routing"]
    on = plan("deepseek-v3-671b-a3", ["correction=r3"], check_machine=False, stack="current", modes_too=False)
    rows = {r.rule: r.values for r in on.results if r.group == "routing"}
    # the flagship: 512 prompts x 16 samples, 1024 + 2048 tokens, 61 layers, top-8, int16
    assert rows["R3: routed ids a step"].startswith(f"{512 * 16 * 3072 * 61 * 8:,} ")
    assert rows["R3: step batch (host)"].startswith(f"{512 * 16 * 3072 * 61 * 8 * 2 / 1e9:.2f} GB")
    assert "32 DP groups of 8" in rows["R3: actor rank share"]
    assert "R3: vLLM slot buffer (host)" in rows and "R3: replay transfer time" in rows


def test_measuring_the_routing_is_priced_as_the_ids_it_carries():
    """launch.measure_routing=true carries the same routed ids as R3 (the flagship has it off for that) and
    records the actor's own routes beside them: the planner says both."""
    from tools.plan import plan

    on = plan(
        "deepseek-v3-671b-a3",
        ["correction=none", "launch.measure_routing=true"],
        check_machine=False,
        stack="current",
        modes_too=False,
    )
    rows = {r.rule: r.values for r in on.results if r.group == "routing"}
    assert rows["measure: step batch (host)"].startswith(f"{512 * 16 * 3072 * 61 * 8 * 2 / 1e9:.2f} GB")
    assert rows["measure: the actor's routes"].startswith("at most 0.768 GB a rank")
    assert not [r for r in rows if r.startswith("R3:")]
