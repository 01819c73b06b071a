"""The planner's FLOP count against torch's own: one forward + backward of an MLA layer, a dense-MLP layer
and a MoE layer, counted by torch.utils.flop_counter.FlopCounterMode on CPU, within 2% of
tools/plan/flops.py (3 forwards: fwd + bwd).

The reference modules compute what Megatron's layers compute, in plain torch: MLA with q/kv low-rank
projections, the latent expanded into per-head keys and values (Megatron's training path, nothing
absorbed), rotary parts split off and concatenated, attention as explicit products (no mask: the count
then is s keys a query; the planner's causal mode halves that); SwiGLU MLPs; a top-k router over every
routed expert (no token dropped) plus shared experts. The MLA and dense layers run at DeepSeek-V3's full
width on the meta device (shapes only, no memory); the MoE layer needs real routing, so it runs on CPU
at a reduced width with the same structure.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from tests.tools.plan import plan_shapes as shapes
from tools.plan import flops as F
from tools.plan.memory import Arch

DSV3 = Arch.from_config(  # DeepSeek-V3 671B: the shapes of the CPU measurements at full depth and width
    shapes.FULL | dict(vocab_size=129280, num_hidden_layers=61, first_k_dense_replace=3, n_routed_experts=256,
                       num_experts_per_tok=8)
)  # fmt: skip
QWEN25_7B = Arch(
    model_type="qwen2",
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
)


class MLA(nn.Module):
    def __init__(self, a: Arch):
        super().__init__()
        n, qk = a.num_attention_heads, a.qk_nope_head_dim + a.qk_rope_head_dim
        self.a = a
        self.q_down = nn.Linear(a.hidden_size, a.q_lora_rank, bias=False)
        self.q_norm = nn.RMSNorm(a.q_lora_rank)
        self.q_up = nn.Linear(a.q_lora_rank, n * qk, bias=False)
        self.kv_down = nn.Linear(a.hidden_size, a.kv_lora_rank + a.qk_rope_head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(a.kv_lora_rank)
        self.kv_up = nn.Linear(a.kv_lora_rank, n * (a.qk_nope_head_dim + a.v_head_dim), bias=False)
        self.out = nn.Linear(n * a.v_head_dim, a.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [b, s, h]
        a = self.a
        b, s, _ = x.shape
        n, dn, dr, dv = a.num_attention_heads, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim
        q = self.q_up(self.q_norm(self.q_down(x))).view(b, s, n, dn + dr)
        latent, k_rope = self.kv_down(x).split([a.kv_lora_rank, dr], dim=-1)
        kv = self.kv_up(self.kv_norm(latent)).view(b, s, n, dn + dv)
        k_nope, v = kv.split([dn, dv], dim=-1)
        k = torch.cat([k_nope, k_rope.unsqueeze(2).expand(b, s, n, dr)], dim=-1)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [b, n, s, d]
        p = torch.softmax(q @ k.transpose(-1, -2) / (dn + dr) ** 0.5, dim=-1)
        return self.out((p @ v).transpose(1, 2).reshape(b, s, n * dv))


class GQA(nn.Module):
    def __init__(self, a: Arch):
        super().__init__()
        self.a = a
        hd = a.hidden_size // a.num_attention_heads
        self.q = nn.Linear(a.hidden_size, a.num_attention_heads * hd)
        self.k = nn.Linear(a.hidden_size, a.num_key_value_heads * hd)
        self.v = nn.Linear(a.hidden_size, a.num_key_value_heads * hd)
        self.o = nn.Linear(a.num_attention_heads * hd, a.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.a
        b, s, _ = x.shape
        n, kvh = a.num_attention_heads, a.num_key_value_heads
        hd = a.hidden_size // n
        q = self.q(x).view(b, s, n, hd).transpose(1, 2)
        k = self.k(x).view(b, s, kvh, hd).transpose(1, 2).repeat_interleave(n // kvh, dim=1)
        v = self.v(x).view(b, s, kvh, hd).transpose(1, 2).repeat_interleave(n // kvh, dim=1)
        p = torch.softmax(q @ k.transpose(-1, -2) / hd**0.5, dim=-1)
        return self.o((p @ v).transpose(1, 2).reshape(b, s, n * hd))


class SwiGLU(nn.Module):
    def __init__(self, h: int, f: int):
        super().__init__()
        self.gate, self.up = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
        self.down = nn.Linear(f, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class MoE(nn.Module):
    """Megatron's MoE layer without token dropping: a sigmoid top-k router, each token through its k
    routed experts (gathered per expert, as the grouped GEMM does), plus the shared experts."""

    def __init__(self, a: Arch):
        super().__init__()
        self.a = a
        self.router = nn.Linear(a.hidden_size, a.n_routed_experts, bias=False)
        self.experts = nn.ModuleList(
            SwiGLU(a.hidden_size, a.moe_intermediate_size) for _ in range(a.n_routed_experts)
        )
        self.shared = SwiGLU(a.hidden_size, a.moe_intermediate_size * a.n_shared_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        weight, expert = torch.sigmoid(self.router(x)).topk(self.a.num_experts_per_tok, dim=-1)
        out = self.shared(x)
        for e, mlp in enumerate(self.experts):
            token, slot = (expert == e).nonzero(as_tuple=True)
            if token.numel():
                out = out.index_add(0, token, mlp(x[token]) * weight[token, slot, None])
        return out.reshape(shape)


def counted(module: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one forward + backward as torch counts them."""
    with FlopCounterMode(display=False) as fc:
        module(x).sum().backward()
    return fc.get_total_flops()


def planned(a: Arch, layer: int, s: int, b: int, part: str) -> float:
    lf = F.layer_flops(a, layer, s, causal=False)
    fwd = {"attention": lf.attention_linear + lf.attention_core, "mlp": lf.mlp}[part]
    return F.train_multiplier(0.0) * fwd * b


@pytest.mark.parametrize("a", [DSV3, QWEN25_7B], ids=["mla", "gqa"])
def test_attention_layer_flops_match_torch(a):
    torch.manual_seed(0)
    s, b = 512, 2
    with torch.device("meta"):
        module = MLA(a) if a.mla else GQA(a)
        x = torch.empty(b, s, a.hidden_size, requires_grad=True)
    got, want = counted(module, x), planned(a, 0, s, b, "attention")
    assert got == pytest.approx(want, rel=0.02), f"torch {got:.4g} vs planner {want:.4g}"


def test_dense_mlp_layer_flops_match_torch():
    s, b = 512, 2
    with torch.device("meta"):
        module = SwiGLU(DSV3.hidden_size, DSV3.intermediate_size)
        x = torch.empty(b, s, DSV3.hidden_size, requires_grad=True)
    got, want = counted(module, x), planned(DSV3, 0, s, b, "mlp")
    assert got == pytest.approx(want, rel=0.02), f"torch {got:.4g} vs planner {want:.4g}"


def test_moe_layer_flops_match_torch():
    small = Arch(
        model_type="deepseek_v3",
        vocab_size=1024,
        hidden_size=512,
        intermediate_size=1536,
        moe_intermediate_size=128,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        num_attention_heads=8,
        n_routed_experts=32,
        n_shared_experts=1,
        num_experts_per_tok=4,
    )
    torch.manual_seed(0)
    s, b = 64, 2
    module = MoE(small)
    x = torch.randn(b, s, small.hidden_size, requires_grad=True)
    got, want = counted(module, x), planned(small, 1, s, b, "mlp")
    assert got == pytest.approx(want, rel=0.02), f"torch {got:.4g} vs planner {want:.4g}"


def test_causal_count_is_the_mean_key_count():
    """The planner's causal attention sees (s+1)/2 keys a query: the core halves, projections do not."""
    full = F.attention_flops(DSV3, 4096, causal=False)
    causal = F.attention_flops(DSV3, 4096, causal=True)
    assert causal[0] == full[0]
    assert causal[1] == pytest.approx(full[1] * 4097 / 2 / 4096)


def test_deepseek_v3_active_params_are_the_published_37b():
    """DeepSeek-V3 activates 37B parameters a token (its model card) = matmul FLOPs / 2 of one token,
    embedding lookup excluded and the LM head included."""
    assert F.active_params(DSV3) / 1e9 == pytest.approx(37.0, abs=1.0)
