"""Synthetic DeepSeek-V3-shaped checkpoints (FP8 or BF16) for tests and benchmarks.

Values are random but deterministic (seeded per tensor name). `tiny_config()` gives a model small
enough for transformers and Megatron on CPU with every structural feature of DeepSeek-V3: MLA with
q/kv LoRA, first-k dense layers, MoE with a shared expert and a router bias, shapes that are not
multiples of 128 (partial FP8 edge blocks), and an MTP layer.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tools.weights.fp8 import quantize
from tools.weights.safetensors_index import INDEX_NAME
from tools.weights.safetensors_writer import StreamingWriter


def tiny_config(**overrides: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": 300,
        "hidden_size": 200,  # not a multiple of 128: partial edge blocks everywhere
        "intermediate_size": 264,
        "moe_intermediate_size": 72,
        "num_hidden_layers": 3,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 136,
        "kv_lora_rank": 48,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "hidden_act": "silu",
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "num_nextn_predict_layers": 1,
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
        },
    }
    cfg.update(overrides)
    return cfg


@dataclass(frozen=True)
class Spec:
    name: str
    shape: tuple[int, ...]
    kind: str  # "linear" (FP8 in the Hub checkpoint), "norm", "embed", "router", "bias"


def hf_layer_specs(cfg: dict[str, Any], layer: int, prefix: str) -> list[Spec]:
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    out = [Spec(f"{prefix}.input_layernorm.weight", (h,), "norm")]
    a = f"{prefix}.self_attn"
    if cfg.get("q_lora_rank"):
        out += [
            Spec(f"{a}.q_a_proj.weight", (cfg["q_lora_rank"], h), "linear"),
            Spec(f"{a}.q_a_layernorm.weight", (cfg["q_lora_rank"],), "norm"),
            Spec(f"{a}.q_b_proj.weight", (nh * qk, cfg["q_lora_rank"]), "linear"),
        ]
    else:
        out.append(Spec(f"{a}.q_proj.weight", (nh * qk, h), "linear"))
    out += [
        Spec(f"{a}.kv_a_proj_with_mqa.weight", (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], h), "linear"),
        Spec(f"{a}.kv_a_layernorm.weight", (cfg["kv_lora_rank"],), "norm"),
        Spec(
            f"{a}.kv_b_proj.weight",
            (nh * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), cfg["kv_lora_rank"]),
            "linear",
        ),
        Spec(f"{a}.o_proj.weight", (h, nh * cfg["v_head_dim"]), "linear"),
        Spec(f"{prefix}.post_attention_layernorm.weight", (h,), "norm"),
    ]
    m = f"{prefix}.mlp"
    if layer < cfg["first_k_dense_replace"]:
        i = cfg["intermediate_size"]
        out += [
            Spec(f"{m}.gate_proj.weight", (i, h), "linear"),
            Spec(f"{m}.up_proj.weight", (i, h), "linear"),
            Spec(f"{m}.down_proj.weight", (h, i), "linear"),
        ]
    else:
        i, e = cfg["moe_intermediate_size"], cfg["n_routed_experts"]
        out += [
            Spec(f"{m}.gate.weight", (e, h), "router"),
            Spec(f"{m}.gate.e_score_correction_bias", (e,), "bias"),
        ]
        for x in range(e):
            out += [
                Spec(f"{m}.experts.{x}.gate_proj.weight", (i, h), "linear"),
                Spec(f"{m}.experts.{x}.up_proj.weight", (i, h), "linear"),
                Spec(f"{m}.experts.{x}.down_proj.weight", (h, i), "linear"),
            ]
        si = i * cfg["n_shared_experts"]
        out += [
            Spec(f"{m}.shared_experts.gate_proj.weight", (si, h), "linear"),
            Spec(f"{m}.shared_experts.up_proj.weight", (si, h), "linear"),
            Spec(f"{m}.shared_experts.down_proj.weight", (h, si), "linear"),
        ]
    return out


def hf_specs(cfg: dict[str, Any], mtp: bool = True) -> list[Spec]:
    """All tensors of a Hub DeepSeek-V3 checkpoint (BF16 view: no scales), MTP layers included."""
    h, v, n = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    out = [Spec("model.embed_tokens.weight", (v, h), "embed")]
    for layer in range(n):
        out += hf_layer_specs(cfg, layer, f"model.layers.{layer}")
    out += [Spec("model.norm.weight", (h,), "norm"), Spec("lm_head.weight", (v, h), "embed")]
    if mtp:
        for k in range(cfg.get("num_nextn_predict_layers", 0)):
            p = f"model.layers.{n + k}"
            out += [
                Spec(f"{p}.embed_tokens.weight", (v, h), "embed"),
                Spec(f"{p}.enorm.weight", (h,), "norm"),
                Spec(f"{p}.hnorm.weight", (h,), "norm"),
                Spec(f"{p}.eh_proj.weight", (h, 2 * h), "linear"),
                Spec(f"{p}.shared_head.norm.weight", (h,), "norm"),
                Spec(f"{p}.shared_head.head.weight", (v, h), "embed"),
            ]
            out += hf_layer_specs(cfg, max(n, cfg["first_k_dense_replace"]), p)
    return out


def _gen(name: str, seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(name.encode()) + seed)


def make_value(spec: Spec, seed: int = 0, fast: bool = False) -> torch.Tensor:
    """The BF16 (or fp32 for the router bias) value of a tensor."""
    g = _gen(spec.name, seed)
    if spec.kind == "norm":
        return (1.0 + 0.1 * torch.randn(spec.shape, generator=g)).to(torch.bfloat16)
    if spec.kind == "bias":
        return 0.01 * torch.randn(spec.shape, generator=g, dtype=torch.float32)
    if fast:  # the bench: cheap bytes, not a meaningful model
        return torch.randint(-16000, 16000, spec.shape, generator=g, dtype=torch.int16).view(torch.bfloat16)
    std = 0.02 if spec.kind != "linear" else 1.0 / math.sqrt(spec.shape[-1])
    return (std * torch.randn(spec.shape, generator=g)).to(torch.bfloat16)


def make_fp8(spec: Spec, seed: int = 0, fast: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    if fast:
        g = _gen(spec.name, seed)
        q = torch.randint(0, 0x7E, spec.shape, generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
        sshape = tuple(-(-d // 128) for d in spec.shape)
        return q, torch.rand(sshape, generator=g, dtype=torch.float32) * 1e-3
    return quantize(make_value(spec, seed))


def write_checkpoint(
    root: Path,
    cfg: dict[str, Any],
    fp8: bool = True,
    shard_bytes: int = 256 << 10,
    seed: int = 0,
    mtp: bool = True,
    scale_elsewhere: str | None = None,
    fast: bool = False,
    extra_files: bool = True,
    progress: Callable[[int], None] | None = None,
) -> dict[str, str]:
    """Write a sharded HF checkpoint to `root`; returns the weight map (tensor -> file).

    `scale_elsewhere`: the FP8 weight whose `_scale_inv` goes into a different shard than the weight.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    entries: list[tuple[str, torch.dtype, tuple[int, ...], Callable[[], torch.Tensor]]] = []
    for spec in hf_specs(cfg, mtp=mtp):
        if fp8 and spec.kind == "linear":
            cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

            def pair(spec: Spec = spec, cache: dict = cache) -> tuple[torch.Tensor, torch.Tensor]:
                if "v" not in cache:
                    cache["v"] = make_fp8(spec, seed, fast)
                return cache["v"]

            sshape = tuple(-(-d // 128) for d in spec.shape)
            entries.append((spec.name, torch.float8_e4m3fn, spec.shape, lambda p=pair: p()[0]))
            entries.append(
                (spec.name + "_scale_inv", torch.float32, sshape, lambda p=pair, c=cache: _pop(p, c))
            )
        else:
            dtype = torch.float32 if spec.kind == "bias" else torch.bfloat16
            entries.append((spec.name, dtype, spec.shape, lambda s=spec: make_value(s, seed, fast)))

    # assign shards in order by size
    files: list[list[int]] = [[]]
    size = 0
    for i, (_, dtype, shape, _) in enumerate(entries):
        nbytes = math.prod(shape) * dtype.itemsize
        if files[-1] and size + nbytes > shard_bytes:
            files.append([])
            size = 0
        files[-1].append(i)
        size += nbytes
    if scale_elsewhere is not None:
        si = next(i for i, e in enumerate(entries) if e[0] == scale_elsewhere + "_scale_inv")
        src = next(f for f in files if si in f)
        dst = next((f for f in files if f is not src), None)
        if dst is None:
            raise ValueError("scale_elsewhere needs at least two shards")
        src.remove(si)
        dst.append(si)
    n = len(files)
    weight_map: dict[str, str] = {}
    total = 0
    for k, idx in enumerate(files):
        fname = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
        # a scale placed in another shard is generated with its weight: generate weights first
        order = sorted(idx, key=lambda i: (entries[i][0].endswith("_scale_inv"), i))
        writer = StreamingWriter(root / fname, [entries[i][:3] for i in order], metadata={"format": "pt"})
        for i in order:
            name, dtype, shape, fn = entries[i]
            t = fn()
            writer.write(name, t)
            weight_map[name] = fname
            total += t.numel() * t.element_size()
            if progress:
                progress(t.numel() * t.element_size())
        writer.close()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (root / INDEX_NAME).write_text(json.dumps(index, indent=2))
    c = dict(cfg)
    if not fp8:
        c.pop("quantization_config", None)
    (root / "config.json").write_text(json.dumps(c, indent=2))
    if extra_files:
        (root / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 256}))
        (root / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
        (root / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    return weight_map


def _pop(pair: Callable[[], tuple[torch.Tensor, torch.Tensor]], cache: dict) -> torch.Tensor:
    s = pair()[1]
    cache.pop("v", None)  # the scale is written after its weight: free both
    return s
