"""Sampling with the stack's own vLLM engine, one engine in this process: vLLM's CPU build here (the
recipe's portable kernels, as tools/cpu_kernels.py pins them for training's rollout), vllm-ascend on an NPU
node (the same API). On a cluster, one engine a node, each node a share of the problems (docs/evaluation.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.cpu_kernels import engine_settings


@dataclass(frozen=True)
class Sampling:
    k: int = 16  # responses a problem
    temperature: float = 0.6  # DeepSeek-R1, section 3
    top_p: float = 0.95
    max_new_tokens: int = 32768
    seed: int = 0


@dataclass(frozen=True)
class Completion:
    text: str
    length: int  # generated tokens
    truncated: bool  # stopped by the length limit


def on_cpu() -> bool:
    """No NPU (torch_npu) and no CUDA device: vLLM's CPU build runs the engine."""
    if importlib.util.find_spec("torch_npu") is not None:
        return False
    import torch

    return not torch.cuda.is_available()


def model_context(model: Path) -> int | None:
    """The model's context length (config.json max_position_embeddings), or None."""
    try:
        value = json.loads((model / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return None
    return int(value) if value else None


class Engine:
    """A vLLM LLM on `model`, with the tokenizer that renders prompts as verl does (chat template, generation
    prompt) and hands the engine token ids."""

    def __init__(self, model: Path, max_model_len: int, seed: int, cpu_kernels: str = "portable") -> None:
        from transformers import AutoTokenizer

        kwargs: dict[str, Any] = {}
        if on_cpu():
            engine_kwargs, env = engine_settings(cpu_kernels)
            os.environ.update(env)
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process
            kwargs.update(engine_kwargs, kv_cache_memory_bytes=512 << 20, dtype="bfloat16")
        else:
            kwargs.update(gpu_memory_utilization=0.85, trust_remote_code=True)
        from vllm import LLM

        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.llm = LLM(model=str(model), enforce_eager=True, max_model_len=max_model_len, seed=seed, **kwargs)

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def sample(self, prompts: list[list[int]], s: Sampling, seeds: list[int]) -> list[list[Completion]]:
        """s.k completions for each prompt (token ids), each prompt with its own seed: a resumed evaluation
        samples a problem as the first attempt would have."""
        from vllm import SamplingParams, TokensPrompt

        params = [
            SamplingParams(
                n=s.k, temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_new_tokens, seed=seed
            )
            for seed in seeds
        ]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return [
            [Completion(c.text, len(c.token_ids), c.finish_reason == "length") for c in out.outputs]
            for out in outs
        ]


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)
