"""The full DeepSeek-V3 671B config: the converter's plan equals what megatron-core builds."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tools.weights import synthetic
from tools.weights.mcore_plan import plan_checkpoint, plan_layout
from tools.weights.safetensors_index import Checkpoint, TensorInfo

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "fixtures" / "deepseek_v3_config.json"
TE_ONLY = (".core_attention._extra_state/", ".input_layernorm._extra_state/", ".pre_mlp_layernorm._extra_state/",
           "final_layernorm._extra_state/")  # fmt: skip


def full_config() -> dict:
    return json.loads(CONFIG.read_text())


@pytest.mark.megatron
@pytest.mark.every_stack  # the converter against each stack's megatron-core
def test_meta_device_model_has_exactly_the_planned_keys_and_shapes(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[2]), "PYTHONWARNINGS": "ignore"}
    r = subprocess.run(
        [sys.executable, str(HERE / "megatron_cpu.py"), "--meta", str(CONFIG), "--out", str(tmp_path),
         "--rank", "0", "--world", "1", "--port", "0"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    built = json.loads((tmp_path / "meta_layout.json").read_text())
    tensors, objects = plan_layout(full_config())
    assert {k: tuple(v) for k, v in built["tensors"].items()} == {k: t.shape for k, t in tensors.items()}
    assert len(tensors) == 906
    assert round(sum(t.numel for t in tensors.values()) / 1e9, 2) == 671.03
    # every object the model asks for is written; the extras are Transformer-Engine-only modules
    # (core attention, TE norms) that the local spec does not have
    assert set(built["objects"]) <= set(objects)
    extras = set(objects) - set(built["objects"])
    assert extras and all(any(t in k for t in TE_ONLY) for k in extras)
    assert len(extras) == 61 + 61 + 58 + 1


class IndexOnly(Checkpoint):
    """A checkpoint known by its index only (names, dtypes, shapes): enough to plan 671B here."""

    def __init__(self, cfg: dict):
        self.root = Path("/nonexistent/DeepSeek-V3")
        self.tensors = {}
        for spec in synthetic.hf_specs(cfg):
            if spec.kind == "linear":
                dtype = torch.float8_e4m3fn
                sshape = tuple(math.ceil(d / 128) for d in spec.shape)
                n = spec.name + "_scale_inv"
                self.tensors[n] = TensorInfo(
                    n, "model.safetensors", torch.float32, sshape, 0, 4 * math.prod(sshape)
                )
            else:
                dtype = torch.float32 if spec.kind == "bias" else torch.bfloat16
            nbytes = math.prod(spec.shape) * dtype.itemsize
            self.tensors[spec.name] = TensorInfo(spec.name, "model.safetensors", dtype, spec.shape, 0, nbytes)
        self.files = ["model.safetensors"]
        self.file_tensors = {"model.safetensors": list(self.tensors.values())}


def test_full_plan_covers_every_element_once_and_skips_mtp():
    cfg = full_config()
    plan = plan_checkpoint(cfg, IndexOnly(cfg))  # raises on any hole or overlap
    assert len(plan.tensors) == 906
    assert sum(p.numel for t in plan.tensors.values() for p in t.pieces) == plan.params
    assert all(
        t.dtype == (torch.float32 if t.key.endswith("expert_bias") else torch.bfloat16)
        for t in plan.tensors.values()
    )
    assert plan.skipped and all(n.startswith("model.layers.61.") for n in plan.skipped)
    biggest = max(p.numel * 2 for t in plan.tensors.values() for p in t.pieces)
    assert biggest <= 64 << 20  # default chunk cap bounds the converter's memory
    experts = plan.tensors["decoder.layers.3.mlp.experts.experts.linear_fc1.weight"]
    assert experts.shape == (256, 4096, 7168)
