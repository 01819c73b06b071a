"""patches/current/megatron: megatron-core 0.16.1 on CPU (gloo) without Transformer Engine (docs/design.md §7b).

Each test runs one gloo rank of the patched megatron-core (third_party/megatron, or third_party/stacks/current/megatron) in a child process
(tests/megatron_child.py); no CUDA stand-ins. Without the patches: the RNG tracker, causal mask and
memory buffer ask torch.cuda (AssertionError: Torch not compiled with CUDA enabled); an MLA model cannot
be built with the local spec (DotProductAttention rejects k_channels/v_channels, and MLA takes Transformer
Engine's mock stand-ins for classes: "isinstance() arg 2 must be a type"); the distributed optimizer's
checkpoint cannot be resumed with torch's Adam.
"""

from __future__ import annotations

import pytest

from tests import megatron_child as mc

pytestmark = [pytest.mark.megatron, pytest.mark.slow]
# what verl 0.9.1 asks of megatron-core >= 0.14 (megatron_checkpoint_manager.py: dp_reshardable unless
# fully reshardable checkpoints are configured); 0.16.1's default model-space sharding refuses
# ShardedTensor.flattened_range
META = {"distrib_optim_sharding_type": "dp_reshardable", "singleton_local_shards": False}

tiny = pytest.fixture(scope="module", name="tiny")(mc.tiny_checkpoint)


def test_device_fallback_rng_tracker_and_buffers(tiny, tmp_path) -> None:
    mc.check_device_fallback(tiny, tmp_path)


def test_mla_with_the_local_spec_matches_transformers(tiny, tmp_path) -> None:
    mc.check_mla_matches_transformers(tiny, tmp_path)


def test_distributed_optimizer_steps_on_cpu(tiny, tmp_path) -> None:
    mc.check_optimizer_steps(tiny, tmp_path)


def test_distributed_optimizer_checkpoint_resumes_on_cpu(tiny, tmp_path) -> None:
    mc.check_optimizer_checkpoint_resumes(tiny, tmp_path, metadata=META)
