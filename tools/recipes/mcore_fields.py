"""Which `override_transformer_config` keys megatron-core takes, read from its source without importing it.

verl 0.6.0 passes actor.megatron.override_transformer_config into Megatron's (MLA)TransformerConfig and
drops a key the dataclass does not have with only a warning (config_converter.check_and_construct_configs),
so a misspelt key silently does nothing. MindSpeed (NPU profile) reads some more keys as its own
arguments; those are listed here with what they do, so that the planner and the recipe tests can tell
"MindSpeed argument" from "typo". Parsing the source with ast keeps the planner fast (no torch import).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from tools.patches.config import tree_of


def megatron_core() -> Path:
    """megatron/core in the stack's megatron-core tree."""
    return tree_of("megatron") / "megatron" / "core"


# MindSpeed (f6688) arguments the published 671B run passes through override_transformer_config.
# They are not TransformerConfig fields: without MindSpeed (CPU/CUDA) verl drops them with a warning.
MINDSPEED_KEYS: dict[str, str] = {
    "multi_head_latent_attention": "MindSpeed MLA switch",
    "use_flash_attn": "MindSpeed fused attention (npu_fusion_attention)",
    "use_fused_rotary_pos_emb": "MindSpeed fused RoPE kernel",
    "use_fused_swiglu": "MindSpeed fused SwiGLU kernel",
    "rope_scaling_type": "MindSpeed RoPE scaling (yarn)",
    "yarn_scaling_factor": "MindSpeed YaRN factor",
    "rope_scaling_mscale": "MindSpeed YaRN mscale",
    "rope_scaling_mscale_all_dim": "MindSpeed YaRN mscale_all_dim",
    "seq_length": "Megatron/MindSpeed training sequence length (args.seq_length)",
    "swap_optimizer": "MindSpeed swap optimizer: optimizer states live on the host, swapped in per step",
    "pipeline_num_transformer_layers": "MindSpeed per-stage layer list",
}


def _class_fields(tree: ast.Module) -> dict[str, tuple[list[str], set[str]]]:
    out: dict[str, tuple[list[str], set[str]]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            fields = {
                stmt.target.id
                for stmt in node.body
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
            }
            bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
            out[node.name] = (bases, fields)
    return out


@functools.cache
def transformer_config_fields(mla: bool = True, root: Path | None = None) -> frozenset[str]:
    """Dataclass fields of (MLA)TransformerConfig including ModelParallelConfig's, at the pinned megatron."""
    root = root or megatron_core()
    classes: dict[str, tuple[list[str], set[str]]] = {}
    for rel in ("model_parallel_config.py", "transformer/transformer_config.py"):
        path = root / rel
        if not path.is_file():
            return frozenset()
        classes.update(_class_fields(ast.parse(path.read_text())))
    name = "MLATransformerConfig" if mla else "TransformerConfig"
    fields: set[str] = set()
    todo = [name]
    while todo:
        cls = todo.pop()
        if cls in classes:
            bases, own = classes[cls]
            fields |= own
            todo.extend(bases)
    return frozenset(fields)


def classify(keys: list[str], *, mla: bool) -> dict[str, list[str]]:
    """Split override_transformer_config keys into megatron fields, MindSpeed arguments and unknown keys."""
    fields = transformer_config_fields(mla)
    out: dict[str, list[str]] = {"megatron": [], "mindspeed": [], "unknown": []}
    for key in keys:
        if key in fields:
            out["megatron"].append(key)
        elif key in MINDSPEED_KEYS:
            out["mindspeed"].append(key)
        else:
            out["unknown"].append(key)
    return out
