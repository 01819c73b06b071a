"""A tiny model with MLA-style layers whose output depends on the MLA-derived tensors, and a recording
executor standing in for vLLM's workers (the CPU forms of the checks)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

L, N, P, V = 8, 2, 3, 4  # kv_lora_rank, heads, qk_nope_head_dim, v_head_dim
VOCAB, LAYERS, BLOCKS = 32, 2, 6


def derived(kv_b_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W_UV, W_UK_T from kv_b_proj.weight, as vLLM's MLA computes them."""
    w = kv_b_weight.T.reshape(L, N, P + V)
    return w[..., P:].transpose(0, 1).contiguous(), w[..., :P].permute(1, 2, 0).contiguous()


class MLAImpl:
    def __init__(self, kv_b_proj: nn.Linear):
        self.kv_b_proj = kv_b_proj
        self.W_UV = self.W_UK_T = None

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        self.W_UV, self.W_UK_T = (t.to(act_dtype) for t in derived(self.kv_b_proj.weight))


class MLAAttention(nn.Module):
    """Like vllm.attention.Attention(use_mla=True): the forward uses the derived W_UV."""

    use_mla = True

    def __init__(self, kv_b_proj: nn.Linear):
        super().__init__()
        self.impl = MLAImpl(kv_b_proj)
        self.kv_cache = [torch.tensor([])]

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        self.impl.process_weights_after_loading(act_dtype)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:  # [T, L] -> [T, N*V]
        return torch.einsum("tl,nlv->tnv", latent, self.impl.W_UV).reshape(latent.shape[0], N * V)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.kv_a = nn.Linear(L, L, bias=False)
        self.kv_b_proj = nn.Linear(L, N * (P + V), bias=False)
        self.attn = MLAAttention(self.kv_b_proj)
        self.o_proj = nn.Linear(N * V, L, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.o_proj(self.attn(self.kv_a(h)))


class TinyMLAModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, L)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.head = nn.Linear(L, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)

    def load_weights(self, weights) -> None:
        params = dict(self.named_parameters())
        for name, tensor in weights:
            params[name].data.copy_(tensor)


class RecordingExecutor:
    """Stands in for vLLM's executor: binds fresh caches with vLLM's bind_kv_cache, records calls."""

    def __init__(self, runner, forward_context: dict, page_bytes: int, free_bytes: int):
        self.runner, self.forward_context = runner, forward_context
        self.page_bytes, self.free_bytes = page_bytes, free_bytes
        self.calls: list[str] = []
        self.handed: list = []

    def get_kv_cache_specs(self) -> list[dict]:
        self.calls.append("get_kv_cache_specs")
        return [self.specs]

    def determine_available_memory(self) -> list[int]:
        self.calls.append("determine_available_memory")
        return [self.free_bytes]

    def initialize_from_config(self, kv_cache_configs) -> None:
        from vllm.v1.utils import bind_kv_cache

        self.calls.append("initialize_from_config")
        self.handed.append(kv_cache_configs)
        blocks = kv_cache_configs[0].num_blocks
        caches = {name: torch.zeros(blocks, 16, L) for name in self.forward_context}
        bind_kv_cache(caches, self.forward_context, self.runner.kv_caches)


def tiny_engine():
    """model, runner, forward context, EngineCore (patched tree, no __init__, its real
    _initialize_kv_caches with vLLM's get_kv_cache_config), executor; the MLA tensors processed once."""
    from vllm.v1.engine import core
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    model = TinyMLAModel()
    forward_context = {f"model.layers.{i}.attn": layer.attn for i, layer in enumerate(model.layers)}
    runner = SimpleNamespace(model=model, kv_caches=[])
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=L, dtype=torch.float32, use_mla=False)
    executor = RecordingExecutor(
        runner, forward_context, spec.page_size_bytes, BLOCKS * spec.page_size_bytes * LAYERS
    )
    executor.specs = dict.fromkeys(forward_context, spec)
    engine = object.__new__(core.EngineCore)
    engine.model_executor = executor
    engine.scheduler = SimpleNamespace(reset_prefix_cache=lambda: True)
    vllm_config = SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=64),
        cache_config=SimpleNamespace(block_size=16, num_gpu_blocks_override=None),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False),
    )
    engine._initialize_kv_caches(vllm_config)
    for layer in forward_context.values():
        layer.process_weights_after_loading(torch.float32)
    return model, runner, forward_context, engine, executor
