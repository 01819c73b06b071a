"""patches/current/megatron: megatron-core 0.16.1 on CPU (gloo) without Transformer Engine (PATCHES.md 7b).

Each test runs one gloo rank of the patched megatron-core (third_party/current/megatron) in a child process
(tests/megatron_child.py); no CUDA stand-ins. Without the patches: the RNG tracker, causal mask and
memory buffer ask torch.cuda (AssertionError: Torch not compiled with CUDA enabled); an MLA model cannot
be built with the local spec (DotProductAttention rejects k_channels/v_channels, and MLA takes Transformer
Engine's mock stand-ins for classes: "isinstance() arg 2 must be a type"); the distributed optimizer's
checkpoint cannot be resumed with torch's Adam.
"""

from __future__ import annotations

import pytest
import torch

from tests.megatron_child import run_child, tiny_checkpoint

pytestmark = [pytest.mark.megatron, pytest.mark.slow]
# what verl 0.9.1 asks of megatron-core >= 0.14 (megatron_checkpoint_manager.py: dp_reshardable unless
# fully reshardable checkpoints are configured); 0.16.1's default model-space sharding refuses
# ShardedTensor.flattened_range
META = {"distrib_optim_sharding_type": "dp_reshardable", "singleton_local_shards": False}

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
    rep = run_child("optim_ckpt", tiny, tmp_path, metadata=META)
    assert rep["max_diff"] < 1e-6, rep
