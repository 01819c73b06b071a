"""verl patch `verl-engine-the-Megatron-engine-serves-the-CPU-platform` (current stack).

verl 0.9.1 picks the training engine from a registry keyed by device; its Megatron engines register for
"cuda" only (NPU gets MindSpeed's), so on the CPU platform `EngineRegistry.get_engine_cls` raises
"No engine registered for device='cpu'". The patch registers the same Megatron engines for "cpu" too.

`verl-engine-the-Megatron-engine-places-its-batches-by-device-name`: the engine moved its token counts and
micro-batches with .to(get_device_id()), a bare index that torch reads as an accelerator ("Cannot access
accelerator device when none is available" on the CPU platform); it now places them by device name.
test_forward_places_batches_on_the_cpu runs forward_backward_batch (forward only, a padded batch as the
tiny-cpu recipe runs) over a tiny local-spec DeepSeek-V3 in a gloo rank (tests/current/patches/mcore_child.py)
and checks the per-token log-probs against the model's own logits.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.conftest import upstream_tree
from tests.current.patches import mcore_child

pytestmark = pytest.mark.upstream


@pytest.fixture(scope="module")
def registry():
    tree = upstream_tree("verl")
    import verl.workers.engine  # noqa: F401  (registers every engine)
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.megatron import transformer_impl

    assert os.path.realpath(transformer_impl.__file__).startswith(
        os.path.realpath(tree)
    ), transformer_impl.__file__
    return EngineRegistry, transformer_impl


def test_megatron_engines_are_found_on_the_cpu_platform(registry, monkeypatch) -> None:
    engine_registry, impl = registry
    monkeypatch.delenv("VERL_ENGINE_DEVICE", raising=False)
    from verl.utils.device import get_device_name

    assert get_device_name() == "cpu"
    assert engine_registry.get_engine_cls("language_model", "megatron") is impl.MegatronEngineWithLMHead
    assert engine_registry.get_engine_cls("value_model", "megatron") is impl.MegatronEngineWithValueHead


def test_cuda_and_npu_keep_their_engines(registry, monkeypatch) -> None:
    engine_registry, impl = registry
    monkeypatch.setenv("VERL_ENGINE_DEVICE", "cuda")
    monkeypatch.setenv("VERL_ENGINE_VENDOR", "nvidia")
    assert engine_registry.get_engine_cls("language_model", "megatron") is impl.MegatronEngineWithLMHead


@pytest.mark.slow
def test_forward_places_batches_on_the_cpu(tmp_path) -> None:
    upstream_tree("verl")
    mcore_child.write_tiny_config(str(tmp_path / "tiny"))
    rep = mcore_child.run("engine", tmp_path / "tiny", tmp_path)[0]
    assert rep == {"device": "cpu"}
    out = torch.load(tmp_path / "engine.pt")
    assert [t.shape[0] for t in out["log_probs"]] == [6, 3]  # two sequences (7 and 4 tokens), one padded
    for got, want in zip(out["log_probs"], out["want"], strict=True):
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-4), (got - want).abs().max()
