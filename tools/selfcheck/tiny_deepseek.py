"""A tiny DeepSeek-V3 made locally, in the shape vLLM's CPU MLA needs (the current stack's engine checks
and tests): random bf16 weights, config.json, no tokenizer (engines run with skip_tokenizer_init and
token-id prompts)."""

from __future__ import annotations

import json
from pathlib import Path

# What vLLM's CPU MLA needs: head size 576 (kv_lora_rank 512 + qk_rope_head_dim 64), and noaux_tc routing
# with sigmoid scores (else the loader asks for e_score_correction_bias). MoE intermediate a multiple of
# 32 (the CPU experts pad it otherwise). One layer, routed experts only: the smallest model with CPU MoE.
TINY_DEEPSEEK_V3 = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=1,
    first_k_dense_replace=0,
    num_attention_heads=2,
    num_key_value_heads=2,
    q_lora_rank=32,
    kv_lora_rank=512,
    qk_nope_head_dim=32,
    qk_rope_head_dim=64,
    v_head_dim=32,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    norm_topk_prob=True,
    routed_scaling_factor=1.0,
    num_nextn_predict_layers=0,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    rope_scaling=None,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=1,
)


def make_tiny_deepseek_v3(dest: Path, seed: int = 0) -> Path:
    """Random bf16 weights (HF's DeepseekV3ForCausalLM) and config.json at `dest`; no tokenizer (the
    engines run with skip_tokenizer_init and token-id prompts)."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**TINY_DEEPSEEK_V3)).to(torch.bfloat16)
    with torch.no_grad():  # a non-zero routing bias, so that a wrong one changes the routing
        for name, p in model.named_parameters():
            if name.endswith("e_score_correction_bias"):
                p.copy_(torch.randn_like(p.float()).mul(0.01).to(p.dtype))
    model.save_pretrained(dest, safe_serialization=True)
    cfg = json.loads((dest / "config.json").read_text())
    cfg.update(architectures=["DeepseekV3ForCausalLM"], torch_dtype="bfloat16")
    (dest / "config.json").write_text(json.dumps(cfg, indent=1))
    return dest
