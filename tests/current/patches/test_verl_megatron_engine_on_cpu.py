"""verl patch `verl-engine-the-Megatron-engine-serves-the-CPU-platform` (current stack).

verl 0.9.1 picks the training engine from a registry keyed by device; its Megatron engines register for
"cuda" only (NPU gets MindSpeed's), so on the CPU platform `EngineRegistry.get_engine_cls` raises
"No engine registered for device='cpu'". The patch registers the same Megatron engines for "cpu" too.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import upstream_tree

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
