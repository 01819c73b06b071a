"""The trainer's routing of a prompt, for comparison with the rollout engine's routed experts.

The hidden states that enter each MoE layer come from the HF model of the checkpoint (transformers,
float32); the top-k is computed by megatron-core's own routing function
(`megatron.core.transformer.moe.moe_utils.topk_routing_with_score_function`, what TopKRouter.routing calls)
with the model's router weight, score function, group-limited top-k and expert bias. So the comparison
is the engine's kernels and precision against Megatron's router, on the same inputs up to the
attention's precision.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def megatron_topk(logits, config) -> np.ndarray:
    """[tokens, experts] router logits -> [tokens, k] expert ids, by Megatron's routing function with
    the HF config's DeepSeek-V3 routing settings (sigmoid scores, noaux_tc expert bias, group top-k)."""
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function

    bias = config["bias"]
    _, routing_map = topk_routing_with_score_function(
        logits,
        topk=config["top_k"],
        use_pre_softmax=False,
        num_groups=config["n_group"],
        group_topk=config["topk_group"],
        scaling_factor=config["routed_scaling_factor"],
        score_function=config["scoring_func"],
        expert_bias=bias,
    )
    ids = [np.flatnonzero(row) for row in routing_map.cpu().numpy()]
    return np.stack(ids).astype(np.int32)


def trainer_routing(model_dir: Path, prompts: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """Per prompt: [prompt tokens, MoE layers, k] expert ids that Megatron's router picks for every prompt
    token, on hidden states from the HF model (float32)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gates = [(name, m) for name, m in model.named_modules() if name.endswith("mlp.gate")]
    if not gates:
        raise ValueError(f"{model_dir}: the model has no MoE router (no *.mlp.gate module)")
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        m.register_forward_hook(lambda mod, args, out, name=name: seen.__setitem__(name, args[0].detach()))
        for name, m in gates
    ]
    out = []
    try:
        for prompt in prompts:
            seen.clear()
            with torch.no_grad():
                model(torch.tensor([list(prompt)]))
            layers = []
            for name, gate in gates:
                hidden = seen[name].reshape(-1, seen[name].shape[-1]).float()
                logits = hidden @ gate.weight.float().T
                bias = getattr(gate, "e_score_correction_bias", None)
                layers.append(
                    megatron_topk(
                        logits,
                        {
                            "top_k": hf_config.num_experts_per_tok,
                            "n_group": hf_config.n_group,
                            "topk_group": hf_config.topk_group,
                            "routed_scaling_factor": hf_config.routed_scaling_factor,
                            "scoring_func": hf_config.scoring_func,
                            "bias": None if bias is None else bias.float(),
                        },
                    )
                )
            out.append(np.stack(layers, axis=1))
    finally:
        for h in hooks:
            h.remove()
    return out


def engine_routing(llm, prompts: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """Per prompt: [prompt tokens, MoE layers, k] expert ids that a vLLM engine made with
    enable_return_routed_experts=True routed every prompt token to (one step: the prompt's prefill)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(max_tokens=1, temperature=0, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], sp, use_tqdm=False)
    got = []
    for o, p in zip(outs, prompts, strict=True):
        ids = o.outputs[0].routed_experts
        if ids is None:
            raise ValueError(
                "the engine returned no routed_experts: was it made with enable_return_routed_experts?"
            )
        got.append(np.asarray(ids)[: len(p)].astype(np.int32))
    return got
