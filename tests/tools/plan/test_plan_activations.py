"""The counted activation model (tools/plan/activations.py) against the hook counts it was checked
on: megatron-core 0.16.1's DeepSeek-V3 layers with flash-like attention and fused RMSNorm, every tensor
autograd saves counted once by storage (bench/plan_activation_count.py --check; the live rerun is
tests/current/megatron/test_plan_activations_cpu.py). The formula was written at hidden 256, sequence 32
and 48, micro-batch 1 and 2, 4 experts top-2; the configurations below are other widths, lengths,
micro-batches, expert counts and selective-recompute sets. docs/plan-validation.md has the table."""

from __future__ import annotations

import pytest

from tests.tools.plan import plan_shapes as shapes
from tests.tools.plan.plan_shapes import FULL
from tools import plan as P
from tools.plan import activations as A
from tools.plan import memory as M


def narrow(hidden: int, experts: int, topk: int) -> A.Arch:
    return A.Arch.from_config(shapes.narrow(hidden, n_routed_experts=experts, num_experts_per_tok=topk))


# (hidden, seq, micro-batch, experts, top-k, selective modules) -> bytes saved by layer 0 (dense), layer 1
# (MoE), counted by saved_tensors_hooks on CPU (torch 2.13.0+cpu), 2026-11-27
COUNTED = [
    ((512, 40, 3, 8, 3, ()), (3_564_800, 3_181_040)),
    ((768, 96, 2, 8, 2, ()), (8_418_816, 6_676_224)),
    ((7168, 128, 2, 4, 2, ()), (106_139_648, 84_146_688)),  # DeepSeek-V3's full width
    ((7168, 128, 1, 4, 2, ("core_attn", "mla_up_proj")), (36_227_076, 25_230_596)),
    ((384, 64, 1, 6, 2, ("core_attn",)), (1_389_700, 1_101_572)),
    ((384, 24, 2, 8, 4, ("core_attn", "mla_up_proj", "shared_experts")), (728_932, 663_460)),
]


@pytest.mark.parametrize("cfg,counted", COUNTED, ids=[str(c[0]) for c in COUNTED])
def test_the_formula_equals_the_hook_counts_at_configurations_it_was_not_written_at(cfg, counted):
    hidden, seq, mb, experts, topk, mods = cfg
    a = narrow(hidden, experts, topk)
    for i, n in enumerate(counted):
        assert A.saved_layer_bytes(a, i, seq, mb, 1, mods) == pytest.approx(n, rel=0.01), (i, n)


@pytest.mark.parametrize("cfg,counted", COUNTED[:2], ids=[str(c[0]) for c in COUNTED[:2]])
def test_korthikanti_misses_the_counts_by_more_than_10_percent(cfg, counted):
    """The formula the planner used before (34 s b h + the MoE term): what the test above would catch."""
    hidden, seq, mb, experts, topk, _ = cfg
    a = narrow(hidden, experts, topk)
    moe = A.korthikanti_layer_bytes(a, seq, mb)
    assert abs(moe / counted[1] - 1) > 0.10


def gpu_estimate(recompute: str, modules: tuple[str, ...] = ()) -> M.Estimate:
    """The H200 configuration (1 dense + 2 MoE layers, 16 experts top-8, sequence 3072) on a GPU group."""
    cfg = FULL | dict(vocab_size=129280, num_hidden_layers=3, n_routed_experts=16, num_experts_per_tok=8)
    return M.estimate(
        M.Arch.from_config(cfg),
        M.Layout(world=1, stages=[3]),
        capacity_bytes=int(139 * M.GIB),
        seq=3072,
        micro_batch=1,
        logprob_micro_batch=1,
        ref_logprob_micro_batch=1,
        param_offload=False,
        grad_offload=False,
        optimizer_on_host=False,
        optimizer_offload=False,
        ref_param_offload=False,
        full_recompute=recompute == "full",
        selective=modules,
        rollout_tp=1,
        rollout_ep=1,
        gpu_memory_utilization=0.5,
        max_num_seqs=1,
        max_model_len=3072,
        max_num_batched_tokens=3072,
        npu=False,
        device="cuda",
    )


def activations(est: M.Estimate) -> int:
    return next(p.bytes for p in est.phases[0].parts if p.name == "activations")


def test_without_recompute_the_estimate_is_the_counted_sum_not_korthikanti():
    est = gpu_estimate("none")
    a = M.Arch.from_config(FULL | dict(num_hidden_layers=3, n_routed_experts=16, num_experts_per_tok=8))
    counted = sum(A.saved_layer_bytes(a, i, 3072, 1) for i in range(3))
    assert activations(est) == counted
    assert activations(est) > 1.15 * 3 * A.korthikanti_layer_bytes(a, 3072, 1)
    assert "counted" in est.activation_model
    # selective recompute keeps less; full recompute keeps its H200-checked model
    assert activations(gpu_estimate("selective", ("core_attn", "mla_up_proj"))) < activations(est)
    assert "Korthikanti" in gpu_estimate("full").activation_model


def test_recompute_setting_reads_the_recipe_and_names_the_key_when_wrong():
    assert A.recompute_setting({}) == (False, ())
    assert A.recompute_setting({"recompute_granularity": "full"}) == (True, ())
    assert A.recompute_setting({"recompute_granularity": "selective"}) == (False, ("core_attn",))
    with pytest.raises(ValueError, match=r"recompute_modules: unknown \['attn'\]"):
        A.recompute_setting({"recompute_granularity": "selective", "recompute_modules": ["attn"]})
    with pytest.raises(ValueError, match="recompute_granularity: 'block'"):
        A.recompute_setting({"recompute_granularity": "block"})


OTC = "++verl.actor_rollout_ref.actor.megatron.override_transformer_config."


@pytest.mark.parametrize(
    "overrides,expect",
    [
        ([], "full recompute"),
        ([OTC + "recompute_granularity=null"], "no recompute: each layer's saved tensors, counted"),
        (
            [OTC + "recompute_granularity=selective", OTC + "recompute_modules=[core_attn,mla_up_proj]"],
            "selective recompute ['core_attn', 'mla_up_proj']",
        ),
    ],
)
def test_make_plan_says_which_activation_model_the_recipe_selects(overrides, expect):
    p = P.plan("deepseek-v3-671b-a3", overrides, check_machine=False)
    r = p.by_rule("activation model")
    assert expect in r.values, P.render(p)
