"""Megatron torch_dist -> HF: HF -> Megatron -> HF is bit-identical; transformers loads the export."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tools.weights import synthetic
from tools.weights.errors import WeightsError
from tools.weights.fp8_to_bf16 import convert_fp8_to_bf16
from tools.weights.mcore_save import convert_hf_to_mcore
from tools.weights.mcore_to_hf import export_mcore_to_hf

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def mc(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("export")
    synthetic.write_checkpoint(root / "fp8", synthetic.tiny_config(), fp8=True)
    convert_fp8_to_bf16(root / "fp8", root / "bf16", progress=False)
    convert_hf_to_mcore(root / "bf16", root / "mc", chunk_bytes=8 << 10, file_bytes=100_000, progress=False)
    return {"root": root, "bf16": root / "bf16", "mc": root / "mc"}


def _all(root: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(root.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def test_round_trip_is_bit_identical_and_loads_in_transformers(mc, tmp_path):
    out = tmp_path / "hf"
    r = subprocess.run(
        [sys.executable, "-m", "tools.weights", "mcore-to-hf", str(mc["mc"]), str(out), "--config", str(mc["bf16"]),
         "--shard-mb", "1"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    src, got = _all(mc["bf16"]), _all(out)
    want = {n: t for n, t in src.items() if not n.startswith("model.layers.3.")}  # MTP is not exported
    assert set(got) == set(want)
    for n, t in want.items():
        assert got[n].dtype == t.dtype and torch.equal(got[n].view(torch.uint8), t.view(torch.uint8)), n
    idx = json.loads((out / "model.safetensors.index.json").read_text())
    assert idx["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in got.values())
    assert len(set(idx["weight_map"].values())) > 1  # really sharded
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 0 and "quantization_config" not in cfg
    assert (out / "tokenizer.json").read_bytes() == (mc["bf16"] / "tokenizer.json").read_bytes()

    from transformers import DeepseekV3ForCausalLM

    model, info = DeepseekV3ForCausalLM.from_pretrained(
        out, torch_dtype=torch.bfloat16, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    sd = model.state_dict()
    up = want["model.layers.2.mlp.experts.3.up_proj.weight"]
    if "model.layers.2.mlp.experts.gate_up_proj" in sd:  # transformers 5 fuses experts: [E, gate; up, hidden]
        loaded = sd["model.layers.2.mlp.experts.gate_up_proj"][3, -up.shape[0] :]
    else:
        loaded = sd["model.layers.2.mlp.experts.3.up_proj.weight"]
    assert torch.equal(loaded, up)


def test_missing_chunk_is_reported(mc, tmp_path):
    bad = tmp_path / "mc"
    bad.mkdir()
    for p in mc["mc"].iterdir():
        (bad / p.name).write_bytes(p.read_bytes())
    md = pickle.loads((bad / ".metadata").read_bytes())
    key = "decoder.layers.1.mlp.experts.experts.linear_fc2.weight"
    md.state_dict_metadata[key].chunks.pop(2)
    (bad / ".metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(WeightsError, match=rf"{key} has stored chunks covering .* checkpoint is incomplete"):
        export_mcore_to_hf(bad, mc["bf16"], tmp_path / "out", progress=False)


def test_missing_file_is_reported(mc, tmp_path):
    bad = tmp_path / "mc"
    bad.mkdir()
    for p in mc["mc"].iterdir():
        if p.name != "__0_5.distcp":
            (bad / p.name).write_bytes(p.read_bytes())
    with pytest.raises(WeightsError, match=r"__0_5.distcp: missing"):
        export_mcore_to_hf(bad, mc["bf16"], tmp_path / "out", progress=False)


def test_config_of_another_model_is_refused(mc, tmp_path):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(synthetic.tiny_config(hidden_size=256)))
    with pytest.raises(WeightsError, match=r"embedding.word_embeddings.weight has shape \[300, 200\]"):
        export_mcore_to_hf(mc["mc"], tmp_path / "cfg", tmp_path / "out", progress=False)


# ---- damaged checkpoints and make train's own --------------------------------------------------------


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def test_truncated_distcp_is_one_line_and_nothing_is_left_behind(mc, tmp_path):
    bad = _copy(mc["mc"], tmp_path / "mc")
    victim = bad / "__0_3.distcp"
    victim.write_bytes(victim.read_bytes()[:1000])
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "tools.weights", "mcore-to-hf", str(bad), str(out), "--config", str(mc["bf16"])],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{victim}: truncated: 1000 bytes" in lines[0], r.stderr
    assert not out.exists() and not list(tmp_path.glob("out*"))


def test_a_failure_mid_export_leaves_no_output_folder(mc, tmp_path, monkeypatch):
    from tools.weights import mcore_to_hf

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(mcore_to_hf, "copy_side_files", boom)  # the last step of the export
    with pytest.raises(RuntimeError, match="disk full"):
        export_mcore_to_hf(mc["mc"], mc["bf16"], tmp_path / "out", progress=False)
    assert not list(tmp_path.glob("out*"))


def test_a_folder_with_files_is_not_overwritten(mc, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep")
    with pytest.raises(WeightsError, match="exists and is not an empty folder"):
        export_mcore_to_hf(mc["mc"], mc["bf16"], tmp_path / "out", progress=False)
    assert (tmp_path / "out" / "mine.txt").read_text() == "keep"


def test_the_local_layer_spec_is_read_from_the_checkpoint(mc, tmp_path):
    """make train saves the actor with megatron-core's local spec (no TE on CPU): its keys say so, and the
    export reads them without --layer-spec, from the checkpoint folder verl wrote (global_step_N)."""
    step = tmp_path / "checkpoints" / "global_step_3"
    local = step / "actor" / "model" / "dist_ckpt"
    convert_hf_to_mcore(
        mc["bf16"], local, chunk_bytes=8 << 10, file_bytes=100_000, progress=False, layer_spec="local"
    )
    out = tmp_path / "hf"
    r = subprocess.run(
        [sys.executable, "-m", "tools.weights", "mcore-to-hf", str(step), str(out), "--config", str(mc["bf16"])],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    got, src = _all(out), _all(mc["bf16"])
    name = "model.layers.0.self_attn.kv_a_layernorm.weight"  # kv_layernorm in the local spec
    assert torch.equal(got[name], src[name])
    assert set(got) == {n for n in src if not n.startswith("model.layers.3.")}
