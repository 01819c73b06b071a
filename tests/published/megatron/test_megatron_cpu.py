"""patches/megatron: megatron-core 0.12.1 on CPU (gloo) without Transformer Engine (PATCHES.md 7b).

Each test runs one gloo rank of the patched megatron-core (third_party/megatron) in a child process
(tests/megatron_child.py); no CUDA stand-ins. Without the patches: the RNG tracker, causal mask and
memory buffer ask torch.cuda (AssertionError: Torch not compiled with CUDA enabled); an MLA model cannot
be built with the local spec (DotProductAttention rejects k_channels/v_channels); the distributed
optimizer's step raises "Invalid Transformer Engine version for FP8 distributed optimizer".
"""

from __future__ import annotations

import pytest
import torch

from tests.megatron_child import run_child, tiny_checkpoint

pytestmark = [pytest.mark.megatron, pytest.mark.slow]

tiny = pytest.fixture(scope="module", name="tiny")(tiny_checkpoint)


def test_device_fallback_rng_tracker_and_buffers(tiny, tmp_path) -> None:
    rep = run_child("rng", tiny, tmp_path)
    assert rep == {
        "default_restored": True,
        "tracked_advanced": True,
        "mask_device": "cpu",
        "mask_causal": True,
        "buffer_device": "cpu",
    }


def test_mla_with_the_local_spec_matches_transformers(tiny, tmp_path) -> None:
    from transformers import DeepseekV3ForCausalLM

    run_child("logits", tiny, tmp_path)
    got = torch.load(tmp_path / "logits.pt")
    model = DeepseekV3ForCausalLM.from_pretrained(tiny[0], torch_dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(got["ids"]).logits
    assert got["logits"].shape == want.shape
    assert torch.allclose(got["logits"], want, atol=1e-4, rtol=1e-4), (got["logits"] - want).abs().max()


def test_distributed_optimizer_steps_on_cpu(tiny, tmp_path) -> None:
    rep = run_child("optimizer", tiny, tmp_path)
    assert rep["ok"] and rep["finite"] and rep["grad_norm"] > 0, rep
    assert rep["changed"], rep


def test_distributed_optimizer_checkpoint_resumes_on_cpu(tiny, tmp_path) -> None:
    rep = run_child("optim_ckpt", tiny, tmp_path)
    assert rep["max_diff"] < 1e-6, rep
