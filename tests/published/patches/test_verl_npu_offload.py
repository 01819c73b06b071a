"""verl patch `verl-vllm-rollout-manual-offload-and-onload...` (docs/design.md §1 and §5).

A tiny model with fake MLA layers (the post-load processing of vLLM's MLA implementation: W_UV and
W_UK_T derived from kv_b_proj), vLLM's real EngineCore built without __init__ (its
`reinitialize_kv_caches` comes from the vLLM patch) over a recording fake executor that binds new
caches with vLLM's real `bind_kv_cache`, and verl's real `vLLMRollout` over a fake LLM exposing that
engine. The device is the CPU here; only the executor and the device cache are fakes.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from tests.published.patches.trees import import_from_tree, import_vllm_rollout

pytestmark = [
    pytest.mark.upstream,
    pytest.mark.slow,  # importing vLLM: about 6-15 s
    pytest.mark.usefixtures("restore_environ"),
]


L, N, P, V = 8, 2, 3, 4  # kv_lora_rank, heads, qk_nope_head_dim, v_head_dim
LAYERS = 2
BLOCKS = 5


def derived(kv_b_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W_UV, W_UK_T as vLLM's MLA computes them from kv_b_proj.weight (independent of the fake)."""
    w = kv_b_weight.T.reshape(L, N, P + V)
    w_uk, w_uv = w[..., :P], w[..., P:]
    return w_uv.transpose(0, 1).contiguous(), w_uk.permute(1, 2, 0).contiguous()


class FakeMLAImpl:
    """Stands in for vLLM's MLA attention implementation (its process_weights_after_loading)."""

    def __init__(self, kv_b_proj: nn.Linear, events: list):
        self.kv_b_proj, self.events = kv_b_proj, events
        self.W_UV = self.W_UK_T = None

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        self.events.append("rebuild_mla")
        w = self.kv_b_proj.weight.T.view(L, N, P + V)
        w_uk, w_uv = w.split([P, V], dim=-1)
        self.W_UV = w_uv.transpose(0, 1).contiguous().to(act_dtype)
        self.W_UK_T = w_uk.permute(1, 2, 0).contiguous().to(act_dtype)


class FakeMLAAttention(nn.Module):
    """Stands in for vllm.attention.Attention with use_mla=True."""

    use_mla = True

    def __init__(self, kv_b_proj: nn.Linear, events: list):
        super().__init__()
        self.impl = FakeMLAImpl(kv_b_proj, events)
        self.kv_cache = [torch.tensor([])]

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        self.impl.process_weights_after_loading(act_dtype)


class Layer(nn.Module):
    def __init__(self, events: list):
        super().__init__()
        self.kv_b_proj = nn.Linear(L, N * (P + V), bias=False)
        self.attn = FakeMLAAttention(self.kv_b_proj, events)
        self.o_proj = nn.Linear(N * V, L)


class TinyModel(nn.Module):
    def __init__(self, events: list):
        super().__init__()
        self.events = events
        self.embed = nn.Embedding(16, L)
        self.layers = nn.ModuleList(Layer(events) for _ in range(LAYERS))

    def load_weights(self, weights) -> None:
        """vLLM's default loader: copy into the existing parameter buffers."""
        self.events.append("load_weights")
        params = dict(self.named_parameters())
        for name, tensor in weights:
            params[name].data.copy_(tensor)


class RecordingExecutor:
    """Stands in for vLLM's executor/workers: records calls, binds caches with vLLM's bind_kv_cache."""

    def __init__(self, runner, forward_context: dict, events: list):
        self.runner, self.forward_context, self.events = runner, forward_context, events
        self.handed: list = []

    def determine_available_memory(self):
        self.events.append("profile_memory")
        return [1 << 20]

    def initialize_from_config(self, kv_cache_configs) -> None:
        from vllm.v1.utils import bind_kv_cache

        self.events.append("init_kv")
        self.handed.append(kv_cache_configs)
        caches = {name: torch.zeros(BLOCKS, 16, L) for name in self.forward_context}
        bind_kv_cache(caches, self.forward_context, self.runner.kv_caches)


class Rig:
    """The tiny engine: model, runner, forward context, EngineCore, executor, scheduler."""

    def __init__(self, core_mod):
        self.events: list[str] = []
        self.model = TinyModel(self.events)
        self.forward_context = {
            f"model.layers.{i}.attn": layer.attn for i, layer in enumerate(self.model.layers)
        }
        self.runner = SimpleNamespace(model=self.model, kv_caches=[])
        self.runner.vllm_config = SimpleNamespace(
            compilation_config=SimpleNamespace(static_forward_context=self.forward_context),
            model_config=SimpleNamespace(dtype=torch.float32),
        )
        self.executor = RecordingExecutor(self.runner, self.forward_context, self.events)
        self.engine = object.__new__(core_mod.EngineCore)
        self.engine.model_executor = self.executor
        self.engine.scheduler = SimpleNamespace(
            reset_prefix_cache=lambda: self.events.append("reset_prefix") or True
        )
        self.kv_cache_configs = [SimpleNamespace(num_blocks=BLOCKS), SimpleNamespace(num_blocks=BLOCKS)]
        self.engine.kv_cache_configs = self.kv_cache_configs  # as _initialize_kv_caches stores them
        # start-up: vLLM binds the first cache and processes the weights once
        self.executor.initialize_from_config(self.kv_cache_configs)
        for layer in self.forward_context.values():
            layer.process_weights_after_loading(torch.float32)
        self.empty_cache_calls = 0
        self.events.clear()

    def empty_cache(self) -> None:
        self.empty_cache_calls += 1
        self.events.append("empty_cache")

    def new_weights(self, seed: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return {n: torch.randn(p.shape, generator=g) for n, p in self.model.named_parameters()}


@pytest.fixture(scope="module")
def mods(tmp_path_factory):
    spmd = import_vllm_rollout(tmp_path_factory.mktemp("meta"))
    core = import_from_tree("vllm", "vllm.v1.engine.core")
    offload = import_from_tree("verl", "verl.workers.rollout.npu.offload")
    return SimpleNamespace(spmd=spmd, core=core, offload=offload)


@pytest.fixture
def rig(mods):
    return Rig(mods.core)


def _offloader(mods, rig):
    return mods.offload.ManualOffloader(
        rig.model, rig.runner, rig.forward_context, rig.engine, torch.float32, rig.empty_cache
    )


def test_offload_aliases_every_parameter_to_its_placeholder(mods, rig):
    off = _offloader(mods, rig)
    params = dict(rig.model.named_parameters())
    off.offload_weights()
    for name, p in params.items():
        assert p.data.is_set_to(off.placeholders[name]), f"{name} does not alias its CPU placeholder"
        assert p.device.type == "cpu" and p.numel() == 0
    for layer in rig.forward_context.values():
        assert layer.impl.W_UV is None and layer.impl.W_UK_T is None, "MLA-derived tensors kept"
    assert rig.empty_cache_calls == 1 and not off.weights_on_device


def test_free_kv_cache_empties_every_cache(mods, rig):
    off = _offloader(mods, rig)
    runner_list = rig.runner.kv_caches
    assert len(runner_list) == LAYERS and all(
        layer.kv_cache[0].numel() > 0 for layer in rig.forward_context.values()
    )
    off.free_kv_cache()
    assert rig.runner.kv_caches is runner_list and runner_list == []
    for layer in rig.forward_context.values():
        assert [c.numel() for c in layer.kv_cache] == [0]
    assert rig.empty_cache_calls == 1


def test_recreate_kv_cache_hands_the_identical_configs(mods, rig):
    off = _offloader(mods, rig)
    for _ in range(3):
        off.free_kv_cache()
        off.recreate_kv_cache()  # vLLM's bind_kv_cache asserts the runner's list was emptied
        assert len(rig.runner.kv_caches) == LAYERS
        assert all(layer.kv_cache[0].shape[0] == BLOCKS for layer in rig.forward_context.values())
    assert len(rig.executor.handed) == 4  # start-up + 3
    assert all(h is rig.kv_cache_configs for h in rig.executor.handed[1:]), "not the stored config object"
    assert "profile_memory" not in rig.events
    assert rig.events.count("reset_prefix") == 3


def test_onload_load_rebuild_gives_fresh_buffers_and_new_mla_tensors(mods, rig):
    off = _offloader(mods, rig)
    shapes = {n: p.shape for n, p in rig.model.named_parameters()}
    old_uv = [layer.impl.W_UV.clone() for layer in rig.forward_context.values()]
    off.release()
    off.onload_weights()
    for name, p in rig.model.named_parameters():
        assert p.shape == shapes[name] and not p.data.is_set_to(off.placeholders[name])
    new = rig.new_weights(seed=1)
    rig.model.load_weights(new.items())
    assert off.rebuild_mla() == LAYERS
    for i, layer in enumerate(rig.forward_context.values()):
        w_uv, w_uk_t = derived(new[f"layers.{i}.kv_b_proj.weight"])
        assert torch.equal(layer.impl.W_UV, w_uv) and torch.equal(layer.impl.W_UK_T, w_uk_t)
        assert not torch.equal(layer.impl.W_UV, old_uv[i])


def test_missing_vllm_patch_is_named(mods, rig):
    with pytest.raises(RuntimeError, match="vllm-v1-engine-keep-KV-cache-configs"):
        mods.offload.ManualOffloader(
            rig.model, rig.runner, rig.forward_context, object(), torch.float32, lambda: None
        )


# ---------------------------------------------------------------- the hooks in vLLMRollout


class FakeLLM:
    """Stands in for vllm.LLM: exposes the rig's engine as LLM/LLMEngine do in-process (v1)."""

    rig: Rig
    kwargs: dict

    def __init__(self, **kwargs):
        FakeLLM.kwargs = kwargs
        rig = FakeLLM.rig
        self.events = rig.events
        worker = SimpleNamespace(worker=SimpleNamespace(model_runner=rig.runner))
        self.llm_engine = SimpleNamespace(
            engine_core=SimpleNamespace(engine_core=rig.engine),
            model_executor=SimpleNamespace(driver_worker=worker),
        )

    def reset_prefix_cache(self):
        self.events.append("llm.reset_prefix_cache")

    def sleep(self, level: int):
        self.events.append(f"llm.sleep({level})")

    def wake_up(self, tags=None):
        self.events.append(f"llm.wake_up({','.join(tags)})")


def _rollout(mods, rig, monkeypatch, npu: bool):
    from verl.workers.config import RolloutConfig

    FakeLLM.rig = rig
    monkeypatch.setattr(mods.spmd, "LLM", FakeLLM)
    monkeypatch.setattr(mods.spmd, "is_npu_available", npu)
    monkeypatch.setattr(mods.spmd, "get_torch_device", lambda: SimpleNamespace(empty_cache=rig.empty_cache))
    monkeypatch.delenv("VLLM_DP_SIZE", raising=False)
    monkeypatch.setenv("VLLM_ENABLE_GRAPH_MODE", "0")
    config = RolloutConfig(
        name="vllm", prompt_length=16, response_length=16, max_num_batched_tokens=64, tensor_model_parallel_size=1,
        free_cache_engine=True,
    )  # fmt: skip
    model_config = SimpleNamespace(
        local_path="/models/tiny", tokenizer=SimpleNamespace(pad_token_id=0),
        hf_config=SimpleNamespace(max_position_embeddings=64), trust_remote_code=False, lora_rank=0,
    )  # fmt: skip
    return mods.spmd.vLLMRollout(config, model_config, device_mesh=None)


def _cycle(rollout, rig) -> dict[str, list[str]]:
    """What megatron_workers does: trainer_mode() after build, then rollout_mode(), then trainer_mode()."""
    out = {}
    loop = asyncio.new_event_loop()
    try:
        rig.events.clear()
        loop.run_until_complete(rollout.release())
        out["release_after_build"] = list(rig.events)
        rig.events.clear()
        loop.run_until_complete(rollout.resume(tags=["weights"]))
        loop.run_until_complete(rollout.update_weights(iter(rig.new_weights(seed=2).items())))
        loop.run_until_complete(rollout.resume(tags=["kv_cache"]))
        out["rollout_mode"] = list(rig.events)
        rig.events.clear()
        loop.run_until_complete(rollout.release())
        out["trainer_mode"] = list(rig.events)
    finally:
        loop.close()
    return out


def test_hook_order_gate_on(mods, rig, monkeypatch):
    rollout = _rollout(mods, rig, monkeypatch, npu=True)
    assert FakeLLM.kwargs["enable_sleep_mode"] is False, "NPU manual offload must build without sleep mode"
    assert rollout.offloader is not None
    params = dict(rig.model.named_parameters())
    events = _cycle(rollout, rig)
    release = ["llm.reset_prefix_cache", "empty_cache", "empty_cache"]  # free KV cache, then offload weights
    assert events["release_after_build"] == release
    assert events["rollout_mode"] == ["load_weights"] + ["rebuild_mla"] * LAYERS + ["init_kv", "reset_prefix"]
    assert events["trainer_mode"] == release
    assert all(p.data.is_set_to(rollout.offloader.placeholders[n]) for n, p in params.items())
    assert rig.runner.kv_caches == [] and rig.executor.handed[-1] is rig.kv_cache_configs


def test_hook_order_gate_off_is_upstream(mods, rig, monkeypatch):
    rollout = _rollout(mods, rig, monkeypatch, npu=False)
    assert FakeLLM.kwargs["enable_sleep_mode"] is True and rollout.offloader is None
    events = _cycle(rollout, rig)
    sleep = f"llm.sleep({mods.spmd.VLLM_SLEEP_LEVEL})"  # 2 with vLLM 0.9.1
    assert events["release_after_build"] == ["llm.reset_prefix_cache", sleep]
    assert events["rollout_mode"] == ["llm.wake_up(weights)", "load_weights", "llm.wake_up(kv_cache)"]
    assert events["trainer_mode"] == ["llm.reset_prefix_cache", sleep]
