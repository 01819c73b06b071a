"""patches/megatron: megatron-core 0.12.1 on CPU (gloo) without Transformer Engine (docs/design.md §7b).

Each test runs one gloo rank of the patched megatron-core (third_party/stacks/published/megatron) in a child process
(tests/megatron_child.py); no CUDA stand-ins. Without the patches: the RNG tracker, causal mask and
memory buffer ask torch.cuda (AssertionError: Torch not compiled with CUDA enabled); an MLA model cannot
be built with the local spec (DotProductAttention rejects k_channels/v_channels); the distributed
optimizer's step raises "Invalid Transformer Engine version for FP8 distributed optimizer".
"""

from __future__ import annotations

import pytest

from tests import megatron_child as mc

pytestmark = [pytest.mark.megatron, pytest.mark.slow]

tiny = pytest.fixture(scope="module", name="tiny")(mc.tiny_checkpoint)


def test_device_fallback_rng_tracker_and_buffers(tiny, tmp_path) -> None:
    mc.check_device_fallback(tiny, tmp_path)


def test_mla_with_the_local_spec_matches_transformers(tiny, tmp_path) -> None:
    mc.check_mla_matches_transformers(tiny, tmp_path)


def test_distributed_optimizer_steps_on_cpu(tiny, tmp_path) -> None:
    mc.check_optimizer_steps(tiny, tmp_path)


def test_distributed_optimizer_checkpoint_resumes_on_cpu(tiny, tmp_path) -> None:
    mc.check_optimizer_checkpoint_resumes(tiny, tmp_path)
