"""Plan a Megatron-core `torch_dist` checkpoint of DeepSeek-V3 from config.json and the HF index alone.

No model is built. For each Megatron key (Transformer-Engine layer spec names, as verl loads them),
the plan gives the global shape, dtype and the chunks ("pieces") that fill it, each piece being rows of
one HF tensor. Layers are non-homogeneous (first k dense), so keys carry the global layer index and
there is no stacked layer axis; routed experts are stacked under one key with a leading expert axis.
Every linear (and TE norm / core attention) gets an `_extra_state` sharded object. MTP layers
(index >= num_hidden_layers) are skipped and reported.

The plan is layout-agnostic: Megatron's loader reads whatever TP/PP/EP slices it needs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from tools.weights.errors import WeightsError
from tools.weights.safetensors_index import SCALE_SUFFIX, Checkpoint, band_rows

DEFAULT_CHUNK_BYTES = 64 << 20


@dataclass(frozen=True)
class Source:
    """Where one HF tensor lands in a Megatron tensor: leading index (expert) and row offset."""

    hf_name: str
    hf_shape: tuple[int, ...]
    key: str
    lead: tuple[int, ...]  # indices on leading axes that the HF tensor does not have (expert axis)
    row_offset: int  # offset along the first axis of the HF tensor inside the Megatron tensor


@dataclass(frozen=True)
class Piece:
    """One chunk of a Megatron tensor: rows [row0, row1) of HF tensor `source`."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    source: str
    row0: int
    row1: int

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)


@dataclass
class TensorPlan:
    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.bfloat16
    sources: list[Source] = field(default_factory=list)
    pieces: list[Piece] = field(default_factory=list)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class Plan:
    tensors: dict[str, TensorPlan]
    objects: list[str]  # unique keys of the `_extra_state` sharded objects
    skipped: list[str]  # HF tensors not converted (MTP), in checkpoint order

    @property
    def params(self) -> int:
        return sum(t.numel for t in self.tensors.values())

    def sources(self) -> dict[str, Source]:
        return {s.hf_name: s for t in self.tensors.values() for s in t.sources}


def is_moe_layer(cfg: dict[str, Any], layer: int) -> bool:
    freq = cfg.get("moe_layer_freq", 1)
    if isinstance(freq, list):
        return bool(freq[layer])
    return (
        bool(cfg.get("n_routed_experts"))
        and layer >= cfg.get("first_k_dense_replace", 0)
        and layer % freq == 0
    )


def object_key(key: str, offset: tuple[int, ...] = (0,), shape: tuple[int, ...] = (1,)) -> str:
    """ShardedObject.unique_key as megatron-core 0.12.1 writes it."""
    return f"{key}/shard_{'.'.join(map(str, offset))}_{'.'.join(map(str, shape))}"


def _require(cfg: dict[str, Any], *names: str) -> None:
    missing = [n for n in names if cfg.get(n) is None]
    if missing:
        raise WeightsError(f"config.json: missing {', '.join(missing)}; is this a DeepSeek-V3 config?")


LAYER_SPECS = ("te", "local")


def plan_layout(cfg: dict[str, Any], layer_spec: str = "te") -> tuple[dict[str, TensorPlan], list[str]]:
    """Megatron keys, global shapes and the HF tensors that fill them, from config.json alone.

    layer_spec "te": the names of megatron-core's Transformer-Engine layer spec (norms fused into the
    following linear: `linear_q_up_proj.layer_norm_weight`, dense `mlp.linear_fc1.layer_norm_weight`);
    "local": its local spec, used without TE (on CPU), where those norms are modules of their own
    (`q_layernorm`, `kv_layernorm`, `pre_mlp_layernorm`). Everything else is named alike.
    """
    if layer_spec not in LAYER_SPECS:
        raise WeightsError(f"layer spec {layer_spec!r}: expected one of {', '.join(LAYER_SPECS)}")
    local = layer_spec == "local"
    _require(
        cfg,
        "hidden_size",
        "vocab_size",
        "num_hidden_layers",
        "num_attention_heads",
        "kv_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "intermediate_size",
    )
    h, v, nh = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"]
    nope, rope, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    qlr, kvlr = cfg.get("q_lora_rank"), cfg["kv_lora_rank"]
    tensors: dict[str, TensorPlan] = {}
    objects: list[str] = []

    def put(
        key: str, shape: tuple[int, ...], hf: str, hf_shape: tuple[int, ...], lead=(), row_offset=0
    ) -> None:
        t = tensors.setdefault(key, TensorPlan(key, shape))
        if t.shape != shape:
            raise AssertionError(f"{key}: planned twice with shapes {t.shape} and {shape}")
        t.sources.append(Source(hf, hf_shape, key, tuple(lead), row_offset))

    def one(key: str, hf: str, shape: tuple[int, ...]) -> None:
        put(key, shape, hf, shape)

    def linear(key: str, hf: str, shape: tuple[int, ...]) -> None:
        one(f"{key}.weight", hf, shape)
        objects.append(object_key(f"{key}._extra_state"))

    def gated(
        key: str, hf_prefix: str, inter: int, lead: tuple[int, ...] = (), n_lead: tuple[int, ...] = ()
    ) -> None:
        shape = (*n_lead, 2 * inter, h)
        put(f"{key}.weight", shape, f"{hf_prefix}.gate_proj.weight", (inter, h), lead, 0)
        put(f"{key}.weight", shape, f"{hf_prefix}.up_proj.weight", (inter, h), lead, inter)

    one("embedding.word_embeddings.weight", "model.embed_tokens.weight", (v, h))
    for layer in range(cfg["num_hidden_layers"]):
        p, hp = f"decoder.layers.{layer}", f"model.layers.{layer}"
        one(f"{p}.input_layernorm.weight", f"{hp}.input_layernorm.weight", (h,))
        objects.append(object_key(f"{p}.input_layernorm._extra_state"))
        a, ha = f"{p}.self_attention", f"{hp}.self_attn"
        if qlr:
            linear(f"{a}.linear_q_down_proj", f"{ha}.q_a_proj.weight", (qlr, h))
            qn = f"{a}.q_layernorm.weight" if local else f"{a}.linear_q_up_proj.layer_norm_weight"
            one(qn, f"{ha}.q_a_layernorm.weight", (qlr,))
            linear(f"{a}.linear_q_up_proj", f"{ha}.q_b_proj.weight", (nh * (nope + rope), qlr))
        else:
            linear(f"{a}.linear_q_proj", f"{ha}.q_proj.weight", (nh * (nope + rope), h))
        linear(f"{a}.linear_kv_down_proj", f"{ha}.kv_a_proj_with_mqa.weight", (kvlr + rope, h))
        kvn = f"{a}.kv_layernorm.weight" if local else f"{a}.linear_kv_up_proj.layer_norm_weight"
        one(kvn, f"{ha}.kv_a_layernorm.weight", (kvlr,))
        linear(f"{a}.linear_kv_up_proj", f"{ha}.kv_b_proj.weight", (nh * (nope + vd), kvlr))
        linear(f"{a}.linear_proj", f"{ha}.o_proj.weight", (h, nh * vd))
        objects.append(object_key(f"{a}.core_attention._extra_state"))
        m, hm = f"{p}.mlp", f"{hp}.mlp"
        if not is_moe_layer(cfg, layer):
            inter = cfg["intermediate_size"]
            mn = f"{p}.pre_mlp_layernorm.weight" if local else f"{m}.linear_fc1.layer_norm_weight"
            one(mn, f"{hp}.post_attention_layernorm.weight", (h,))
            gated(f"{m}.linear_fc1", hm, inter)
            objects.append(object_key(f"{m}.linear_fc1._extra_state"))
            linear(f"{m}.linear_fc2", f"{hm}.down_proj.weight", (h, inter))
            continue
        _require(cfg, "n_routed_experts", "moe_intermediate_size")
        e, inter = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
        one(f"{p}.pre_mlp_layernorm.weight", f"{hp}.post_attention_layernorm.weight", (h,))
        objects.append(object_key(f"{p}.pre_mlp_layernorm._extra_state"))
        one(f"{m}.router.weight", f"{hm}.gate.weight", (e, h))
        if cfg.get("topk_method", "noaux_tc") == "noaux_tc":
            one(f"{m}.router.expert_bias", f"{hm}.gate.e_score_correction_bias", (e,))
        ek = f"{m}.experts.experts"
        for x in range(e):
            gated(f"{ek}.linear_fc1", f"{hm}.experts.{x}", inter, (x,), (e,))
            put(
                f"{ek}.linear_fc2.weight",
                (e, h, inter),
                f"{hm}.experts.{x}.down_proj.weight",
                (h, inter),
                (x,),
            )
            for mod in ("linear_fc1", "linear_fc2"):
                objects.append(object_key(f"{ek}.{mod}._extra_state", (x,), (e,)))
        if cfg.get("n_shared_experts"):
            si = inter * cfg["n_shared_experts"]
            gated(f"{m}.shared_experts.linear_fc1", f"{hm}.shared_experts", si)
            objects.append(object_key(f"{m}.shared_experts.linear_fc1._extra_state"))
            linear(f"{m}.shared_experts.linear_fc2", f"{hm}.shared_experts.down_proj.weight", (h, si))
    one("decoder.final_layernorm.weight", "model.norm.weight", (h,))
    objects.append(object_key("decoder.final_layernorm._extra_state"))
    if not cfg.get("tie_word_embeddings", False):
        one("output_layer.weight", "lm_head.weight", (v, h))  # GPTModel drops output_layer._extra_state
    return tensors, objects


_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def plan_checkpoint(
    cfg: dict[str, Any], ckpt: Checkpoint, chunk_bytes: int = DEFAULT_CHUNK_BYTES, layer_spec: str = "te"
) -> Plan:
    """Check the HF checkpoint against the layout and cut every tensor into pieces of <= chunk_bytes."""
    tensors, objects = plan_layout(cfg, layer_spec)
    n_layers = cfg["num_hidden_layers"]
    wanted: dict[str, Source] = {s.hf_name: s for t in tensors.values() for s in t.sources}
    skipped: list[str] = []
    unexpected: list[str] = []
    for fname in ckpt.files:
        for info in ckpt.file_tensors[fname]:
            name = info.name
            if name in wanted:
                continue
            base = name[: -len(SCALE_SUFFIX)] if name.endswith(SCALE_SUFFIX) else name
            mt = _LAYER.match(name)
            if mt and int(mt.group(1)) >= n_layers:
                skipped.append(name)
            elif base in wanted and name.endswith(SCALE_SUFFIX):
                continue  # consumed with its weight
            elif name.endswith("rotary_emb.inv_freq"):
                skipped.append(name)
            else:
                unexpected.append(name)
    if unexpected:
        raise WeightsError(
            f"{ckpt.root / ckpt.info(unexpected[0]).file}: tensor {unexpected[0]} (and {len(unexpected) - 1} more) "
            "does not belong to the model config.json describes; check that config.json and the weights match"
        )
    missing = [n for n in wanted if n not in ckpt]
    if missing:
        raise WeightsError(
            f"{ckpt.root}: {len(missing)} tensors the config needs are missing from the checkpoint, "
            f"first {missing[0]}; the checkpoint is incomplete or config.json describes another model"
        )
    for t in tensors.values():
        dtypes = set()
        for s in t.sources:
            info = ckpt.info(s.hf_name)
            if info.shape != s.hf_shape:
                raise WeightsError(
                    f"{ckpt.root / info.file}: tensor {s.hf_name} has shape {list(info.shape)}, config.json "
                    f"implies {list(s.hf_shape)}; check that config.json and the weights match"
                )
            if ckpt.is_fp8(s.hf_name):
                ckpt.scale_info(s.hf_name)
            dtypes.add(ckpt.out_dtype(s.hf_name))
            rows = s.hf_shape[0]
            # chunking depends only on the output dtype: FP8 and BF16 sources give identical files
            step = band_rows(s.hf_shape, ckpt.out_dtype(s.hf_name).itemsize, chunk_bytes)
            rest = s.hf_shape[1:]
            for r0 in range(0, rows, step):
                r1 = min(r0 + step, rows)
                t.pieces.append(
                    Piece(
                        offsets=(*s.lead, s.row_offset + r0, *(0 for _ in rest)),
                        sizes=(*(1 for _ in s.lead), r1 - r0, *rest),
                        source=s.hf_name,
                        row0=r0,
                        row1=r1,
                    )
                )
        if len(dtypes) != 1:
            raise WeightsError(f"{t.key}: its HF tensors have different dtypes {dtypes}; expected one")
        t.dtype = dtypes.pop()
    plan = Plan(tensors, objects, skipped)
    check_coverage(plan)
    return plan


def check_coverage(plan: Plan) -> None:
    """Every element of every tensor is covered by exactly one piece (else WeightsError)."""
    for t in plan.tensors.values():
        boxes = [(p.offsets, p.sizes) for p in t.pieces]
        problem = tiling_problem(t.shape, boxes)
        if problem:
            raise WeightsError(f"{t.key} {list(t.shape)}: {problem}; this is a bug in the converter's plan")


def tiling_problem(
    shape: tuple[int, ...], boxes: list[tuple[tuple[int, ...], tuple[int, ...]]]
) -> str | None:
    """None when `boxes` tile `shape` exactly; otherwise a description of the first hole or overlap."""
    for off, size in boxes:
        if len(off) != len(shape) or any(
            o < 0 or s <= 0 or o + s > d for o, s, d in zip(off, size, shape, strict=True)
        ):
            return f"chunk at {list(off)} size {list(size)} outside the tensor"
    if math.prod(shape) == 0:
        return None
    return _tile(shape, boxes, 0, ())


def _tile(shape, boxes, dim, where) -> str | None:
    if dim == len(shape):
        if len(boxes) != 1:
            return f"element {list(where)} covered {len(boxes)} times" if boxes else f"hole at {list(where)}"
        return None
    cuts = sorted({0, shape[dim], *(o[dim] for o, _ in boxes), *(o[dim] + s[dim] for o, s in boxes)})
    order = sorted(boxes, key=lambda b: b[0][dim])
    nxt = 0
    active: list = []
    for a in cuts[:-1]:  # sweep over the elementary intervals [a, next cut) of this dim
        while nxt < len(order) and order[nxt][0][dim] <= a:
            active.append(order[nxt])
            nxt += 1
        active = [(o, s) for o, s in active if o[dim] + s[dim] > a]
        if not active:
            return f"hole at {list(where) + [a]} (no chunk covers index {a} of dim {dim})"
        if dim == len(shape) - 1:
            if len(active) > 1:
                return f"element {list(where) + [a]} covered {len(active)} times"
            continue
        problem = _tile(shape, active, dim + 1, (*where, a))
        if problem:
            return problem
    return None
