"""TEST-ONLY helpers: build a tiny DeepSeek-V3-like megatron-core 0.12.1 GPTModel on CPU and load a
converted checkpoint exactly as verl does (`verl.utils.model.load_mcore_dist_weights`).

The model runs through the patched megatron-core (patches/megatron): its CPU device fallback (current
device, rng tracker, torch_dist save) and MLA with the local spec's DotProductAttention. What is left
here is configuration and test plumbing, not CUDA stand-ins:
- the alltoall token dispatcher creates a CUDA stream: the allgather dispatcher is used (config).
- TP+EP needs sequence parallel, which megatron's WrappedTorchNorm refuses: the check is bypassed
  (norm weights are replicated, so the assertion is irrelevant to loading).
- the checkpoints under test carry the Transformer-Engine names (the NPU run's format); the local-spec
  model's keys are mapped (`LOCAL_TO_TE`) before loading, which is what a TE model would ask for.
  (`hf-to-mcore --layer-spec local` writes the local names directly; tests/megatron loads that.)
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F

LOCAL_TO_TE = [
    ("self_attention.q_layernorm.weight", "self_attention.linear_q_up_proj.layer_norm_weight"),
    ("self_attention.kv_layernorm.weight", "self_attention.linear_kv_up_proj.layer_norm_weight"),
]


def apply_shims() -> None:
    from megatron.core.transformer import torch_norm

    class _Norm:
        def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **_: Any):
            if config.normalization == "RMSNorm":
                return torch.nn.RMSNorm(hidden_size, eps=eps)
            return torch.nn.LayerNorm(hidden_size, eps=eps)

    torch_norm.WrappedTorchNorm = _Norm
    from megatron.core.models.gpt import gpt_layer_specs

    gpt_layer_specs.LNImpl = _Norm
    gpt_layer_specs.WrappedTorchNorm = _Norm


def save_like_megatron(model, path: str) -> None:
    """Megatron's own synchronous torch_dist save of the model's sharded state dict (TE names)."""
    from megatron.core import dist_checkpointing

    dist_checkpointing.save(te_sharded_state_dict(model), path)


def _original_len_field() -> str:
    import dataclasses

    from megatron.core.transformer.transformer_config import MLATransformerConfig

    names = {f.name for f in dataclasses.fields(MLATransformerConfig)}
    return (
        "original_max_position_embeddings"
        if "original_max_position_embeddings" in names
        else "max_position_embeddings"
    )


def mcore_config(hf: dict[str, Any], tp: int = 1, pp: int = 1, ep: int = 1):
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    rs = hf.get("rope_scaling") or {}
    n, k = hf["num_hidden_layers"], hf["first_k_dense_replace"]
    return MLATransformerConfig(
        num_layers=n,
        hidden_size=hf["hidden_size"],
        ffn_hidden_size=hf["intermediate_size"],
        num_attention_heads=hf["num_attention_heads"],
        q_lora_rank=hf["q_lora_rank"],
        kv_lora_rank=hf["kv_lora_rank"],
        qk_head_dim=hf["qk_nope_head_dim"],
        qk_pos_emb_head_dim=hf["qk_rope_head_dim"],
        v_head_dim=hf["v_head_dim"],
        qk_layernorm=True,
        normalization="RMSNorm",
        layernorm_epsilon=hf["rms_norm_eps"],
        add_bias_linear=False,
        gated_linear_unit=True,
        activation_func=F.silu,
        bias_activation_fusion=False,
        rope_type="yarn",
        rotary_base=hf["rope_theta"],
        rotary_scaling_factor=rs.get("factor", 1.0),
        beta_fast=rs.get("beta_fast", 32),
        beta_slow=rs.get("beta_slow", 1),
        mscale=rs.get("mscale", 1.0),
        mscale_all_dim=rs.get("mscale_all_dim", 1.0),
        # MLA's YaRN reads the *original* context length (max_position_embeddings up to 0.12,
        # original_max_position_embeddings in 0.16)
        **{_original_len_field(): rs.get("original_max_position_embeddings", hf["max_position_embeddings"])},
        num_moe_experts=hf["n_routed_experts"],
        moe_ffn_hidden_size=hf["moe_intermediate_size"],
        moe_shared_expert_intermediate_size=hf["moe_intermediate_size"] * hf["n_shared_experts"],
        moe_router_topk=hf["num_experts_per_tok"],
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True,
        moe_router_topk_scaling_factor=hf["routed_scaling_factor"],
        moe_router_num_groups=hf["n_group"],
        moe_router_group_topk=hf["topk_group"],
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
        moe_token_dispatcher_type="allgather",
        moe_layer_freq=[0] * k + [1] * (n - k),
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.float32,
        # uneven stages when num_layers is not a multiple of pp (the tiny model has 3 layers)
        num_layers_in_first_pipeline_stage=(n - (n // pp) * (pp - 1)) if pp > 1 and n % pp else None,
        expert_model_parallel_size=ep,
        sequence_parallel=tp > 1 and ep > 1,
        use_cpu_initialization=True,
        perform_initialization=False,
        params_dtype=torch.float32,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        persist_layer_norm=False,
    )


def build_model(hf: dict[str, Any], tp: int = 1, pp: int = 1, ep: int = 1):
    """A GPTModel for this rank's pipeline stage (parallel_state must be initialised)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    config = mcore_config(hf, tp, pp, ep)
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
    return GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=hf["vocab_size"],
        max_sequence_length=hf["max_position_embeddings"],
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=hf.get("tie_word_embeddings", False),
        position_embedding_type="rope",
    )


def te_sharded_state_dict(model) -> dict:
    """model.sharded_state_dict() with the keys a Transformer-Engine model would use.

    Dense layers: the local spec's pre_mlp_layernorm is TE's mlp.linear_fc1.layer_norm_weight.
    """
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    ssd = model.sharded_state_dict()
    for sh in ssd.values():
        if not isinstance(sh, ShardedTensor):
            continue
        for local, te in LOCAL_TO_TE:
            if sh.key.endswith(local):
                sh.key = sh.key[: -len(local)] + te
        if sh.key.endswith(".pre_mlp_layernorm.weight"):
            layer = sh.key.split(".")[2]
            if not is_moe(model.config, int(layer)):
                sh.key = sh.key.replace(".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight")
    return ssd


def is_moe(config, layer: int) -> bool:
    return bool(config.moe_layer_freq[layer])


def init_dist(rank: int, world: int, port: int, tp: int, pp: int, ep: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep
    )
    from megatron.core import tensor_parallel

    tensor_parallel.model_parallel_cuda_manual_seed(1234)  # as Megatron training (and verl) does


def load_like_verl(model, path: str) -> None:
    """verl.utils.model.load_mcore_dist_weights: load in place, result discarded."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import StrictHandling

    dist_checkpointing.load(te_sharded_state_dict(model), path, strict=StrictHandling.ASSUME_OK_UNEXPECTED)


def expected_global(hf: dict[str, Any], w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The global Megatron tensors (TE names) built directly from HF tensors: the test's own mapping."""
    g: dict[str, torch.Tensor] = {
        "embedding.word_embeddings.weight": w["model.embed_tokens.weight"],
        "decoder.final_layernorm.weight": w["model.norm.weight"],
        "output_layer.weight": w["lm_head.weight"],
    }
    for i in range(hf["num_hidden_layers"]):
        p, q = f"decoder.layers.{i}", f"model.layers.{i}"
        sa, at = f"{p}.self_attention", f"{q}.self_attn"
        g[f"{p}.input_layernorm.weight"] = w[f"{q}.input_layernorm.weight"]
        g[f"{sa}.linear_q_down_proj.weight"] = w[f"{at}.q_a_proj.weight"]
        g[f"{sa}.linear_q_up_proj.layer_norm_weight"] = w[f"{at}.q_a_layernorm.weight"]
        g[f"{sa}.linear_q_up_proj.weight"] = w[f"{at}.q_b_proj.weight"]
        g[f"{sa}.linear_kv_down_proj.weight"] = w[f"{at}.kv_a_proj_with_mqa.weight"]
        g[f"{sa}.linear_kv_up_proj.layer_norm_weight"] = w[f"{at}.kv_a_layernorm.weight"]
        g[f"{sa}.linear_kv_up_proj.weight"] = w[f"{at}.kv_b_proj.weight"]
        g[f"{sa}.linear_proj.weight"] = w[f"{at}.o_proj.weight"]
        m = f"{q}.mlp"
        if i < hf["first_k_dense_replace"]:
            g[f"{p}.mlp.linear_fc1.layer_norm_weight"] = w[f"{q}.post_attention_layernorm.weight"]
            g[f"{p}.mlp.linear_fc1.weight"] = torch.cat(
                [w[f"{m}.gate_proj.weight"], w[f"{m}.up_proj.weight"]]
            )
            g[f"{p}.mlp.linear_fc2.weight"] = w[f"{m}.down_proj.weight"]
            continue
        e = hf["n_routed_experts"]
        g[f"{p}.pre_mlp_layernorm.weight"] = w[f"{q}.post_attention_layernorm.weight"]
        g[f"{p}.mlp.router.weight"] = w[f"{m}.gate.weight"]
        g[f"{p}.mlp.router.expert_bias"] = w[f"{m}.gate.e_score_correction_bias"]
        g[f"{p}.mlp.experts.experts.linear_fc1.weight"] = torch.stack(
            [
                torch.cat([w[f"{m}.experts.{x}.gate_proj.weight"], w[f"{m}.experts.{x}.up_proj.weight"]])
                for x in range(e)
            ]
        )
        g[f"{p}.mlp.experts.experts.linear_fc2.weight"] = torch.stack(
            [w[f"{m}.experts.{x}.down_proj.weight"] for x in range(e)]
        )
        s = f"{m}.shared_experts"
        g[f"{p}.mlp.shared_experts.linear_fc1.weight"] = torch.cat(
            [w[f"{s}.gate_proj.weight"], w[f"{s}.up_proj.weight"]]
        )
        g[f"{p}.mlp.shared_experts.linear_fc2.weight"] = w[f"{s}.down_proj.weight"]
    return g


def fill_sentinel(model) -> None:
    with torch.no_grad():
        for _, t in _loadable(model):
            t.fill_(float("nan"))


def check_loaded(model, expected: dict[str, torch.Tensor]) -> list[str]:
    """Problems (empty when fine): every sharded tensor equals its slice of the expected global
    tensor, every expected key was asked for, and no parameter or buffer is left NaN (unchanged)."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories

    problems: list[str] = []
    ssd = te_sharded_state_dict(model)
    apply_factories(ssd)
    seen = set()
    for sh in _leaves(ssd):
        if not isinstance(sh, ShardedTensor):
            continue
        if sh.key not in expected:
            problems.append(f"{sh.key}: not in the expected tensors")
            continue
        seen.add(sh.key)
        g = expected[sh.key]
        if tuple(g.shape) != tuple(sh.global_shape):
            problems.append(f"{sh.key}: global shape {tuple(sh.global_shape)} vs HF {tuple(g.shape)}")
            continue
        want = g[sh.global_slice()].to(sh.data.dtype)
        if not torch.equal(sh.data, want.reshape(sh.data.shape)):
            problems.append(f"{sh.key} at {sh.global_offset}: differs from the HF tensor")
    for name, t in _loadable(model):
        if torch.isnan(t).any():
            problems.append(f"{name}: left unchanged by the load")
    return problems, seen


def _loadable(model):
    """Parameters, and the buffers that are part of the checkpoint (the router's expert bias)."""
    yield from model.named_parameters()
    yield from ((n, b) for n, b in model.named_buffers() if n.endswith("expert_bias"))


def _leaves(d):
    if isinstance(d, dict):
        for v in d.values():
            yield from _leaves(v)
    elif isinstance(d, list):
        for v in d:
            yield from _leaves(v)
    else:
        yield d


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    pos = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    with torch.no_grad():
        return model(ids, pos, attention_mask=None)


def dump_meta_layout(config_path: str, out: str, port: int) -> int:
    """Build the model of `config_path` on the meta device (no memory for weights) and write the keys,
    global shapes and object keys of its sharded state dict (TE names) to <out>/meta_layout.json."""
    import json

    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor, apply_factories

    with open(config_path) as f:
        hf = json.load(f)
    apply_shims()
    init_dist(0, 1, port, 1, 1, 1)
    with torch.device("meta"):
        model = build_model(hf)
    tensors, objects = {}, []
    ssd = te_sharded_state_dict(model)
    apply_factories(ssd)  # swiglu fc1: gate and up halves of one key
    for sh in _leaves(ssd):
        if isinstance(sh, ShardedTensor):
            tensors[sh.key] = list(sh.global_shape)
        elif isinstance(sh, ShardedObject):
            objects.append(sh.unique_key)
    with open(os.path.join(out, "meta_layout.json"), "w") as f:
        json.dump({"tensors": tensors, "objects": sorted(objects)}, f)
    torch.distributed.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    """One rank: build the model for its layout, load like verl, check, write a JSON report.

    python tests/tools/weights/megatron_cpu.py --ckpt DIR --hf DIR --out DIR --rank R --world W --port P
        [--tp N --pp N --ep N] [--logits]
    """
    import argparse
    import json

    ap = argparse.ArgumentParser()
    ap.add_argument("--meta", help="config.json: build that model on the meta device, dump its layout")
    for a in ("--ckpt", "--hf", "--out"):
        ap.add_argument(a)
    for a in ("--rank", "--world", "--port"):
        ap.add_argument(a, type=int, required=True)
    for a in ("--tp", "--pp", "--ep"):
        ap.add_argument(a, type=int, default=1)
    ap.add_argument("--logits", action="store_true")
    ap.add_argument("--save", help="after loading, save the model through megatron into this directory")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    if a.meta:
        return dump_meta_layout(a.meta, a.out, a.port)
    from safetensors.torch import load_file

    with open(os.path.join(a.hf, "config.json")) as f:
        hf = json.load(f)
    weights: dict[str, torch.Tensor] = {}
    for f in sorted(os.listdir(a.hf)):
        if f.endswith(".safetensors"):
            weights.update(load_file(os.path.join(a.hf, f)))
    apply_shims()
    init_dist(a.rank, a.world, a.port, a.tp, a.pp, a.ep)
    model = build_model(hf, a.tp, a.pp, a.ep)
    fill_sentinel(model)
    load_like_verl(model, a.ckpt)
    problems, seen = check_loaded(model, expected_global(hf, weights))
    report = {
        "problems": problems,
        "seen": sorted(seen),
        "params": sum(t.numel() for _, t in _loadable(model)),
    }
    if a.save:
        save_like_megatron(model, a.save)
    if a.logits:
        ids = torch.randint(0, hf["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(1))
        torch.save({"ids": ids, "logits": logits(model, ids)}, os.path.join(a.out, "logits.pt"))
    with open(os.path.join(a.out, f"rank{a.rank}.json"), "w") as f:
        json.dump(report, f)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
