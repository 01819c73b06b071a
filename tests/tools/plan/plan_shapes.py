"""The model shapes the planner's CPU measurements were taken on (bench/plan_memory_cpu.py,
bench/plan_activation_count.py): DeepSeek-V3's layers with 2 layers, 4 experts and a short vocabulary, and
the same family at a smaller width. One place for the planner's tests."""

from __future__ import annotations

from typing import Any

FULL: dict[str, Any] = dict(  # bench/plan_memory_cpu.py FULL
    model_type="deepseek_v3",
    vocab_size=16384,
    hidden_size=7168,
    intermediate_size=18432,
    moe_intermediate_size=2048,
    num_hidden_layers=2,
    first_k_dense_replace=1,
    num_attention_heads=128,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
)


def narrow(hidden: int, **overrides: Any) -> dict[str, Any]:
    """bench/plan_memory_cpu.py's narrow(hidden): heads, FFNs and LoRA ranks scaled with the width."""
    f = hidden / FULL["hidden_size"]
    return FULL | dict(
        hidden_size=hidden,
        intermediate_size=int(FULL["intermediate_size"] * f),
        moe_intermediate_size=int(FULL["moe_intermediate_size"] * f),
        num_attention_heads=max(1, int(FULL["num_attention_heads"] * f)),
        q_lora_rank=int(FULL["q_lora_rank"] * f),
        kv_lora_rank=int(FULL["kv_lora_rank"] * f),
        **overrides,
    )
