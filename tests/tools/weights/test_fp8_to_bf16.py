"""FP8 -> BF16: exact dequantisation (edge blocks, scale in another shard), index, config, errors, resume."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tools.weights import fp8_to_bf16, synthetic
from tools.weights.errors import WeightsError
from tools.weights.fp8 import dequantize_rows, quantize
from tools.weights.fp8_to_bf16 import convert_fp8_to_bf16

KV_A = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"


def reference_dequant(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Element by block, written independently of tools.weights.fp8."""
    out = torch.empty(q.shape, dtype=torch.float32)
    for bi in range(s.shape[0]):
        for bj in range(s.shape[1]):
            blk = q[bi * 128 : (bi + 1) * 128, bj * 128 : (bj + 1) * 128].to(torch.float32)
            out[bi * 128 : (bi + 1) * 128, bj * 128 : (bj + 1) * 128] = blk * s[bi, bj]
    return out.to(torch.bfloat16)


def read_all(root: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(root.glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.fixture(scope="module")
def fp8_ckpt(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fp8")
    synthetic.write_checkpoint(root, synthetic.tiny_config(), fp8=True, scale_elsewhere=KV_A)
    return root


def test_dequantize_partial_edge_blocks_matches_reference():
    w = torch.randn(300, 200) * 0.05  # 3 x 2 blocks, both edges partial
    q, s = quantize(w)
    assert s.shape == (3, 2)
    ref = reference_dequant(q, s)
    bands = [
        dequantize_rows(q[r : r + 128], s[r // 128 : math.ceil(min(r + 128, 300) / 128)], r)
        for r in range(0, 300, 128)
    ]
    assert torch.equal(torch.cat(bands), ref)
    assert ((ref.float() - w).abs() <= w.abs() / 8 + 1e-4).all()  # e4m3 rounding error, not garbage


def test_convert_tiny_checkpoint(fp8_ckpt, tmp_path):
    index = json.loads((fp8_ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    assert index[KV_A] != index[KV_A + "_scale_inv"]  # the fixture really puts the scale elsewhere
    dst = tmp_path / "bf16"
    report = convert_fp8_to_bf16(fp8_ckpt, dst, threads=2, band_bytes=8 << 10, progress=False)
    src = read_all(fp8_ckpt)
    out = read_all(dst)
    scales = {n for n in src if n.endswith("_scale_inv")}
    assert set(out) == set(src) - scales
    n_fp8 = 0
    for name, t in out.items():
        if src[name].dtype == torch.float8_e4m3fn:
            n_fp8 += 1
            assert t.dtype == torch.bfloat16
            assert torch.equal(t, reference_dequant(src[name], src[name + "_scale_inv"])), name
        else:
            assert t.dtype == src[name].dtype and torch.equal(t, src[name]), name
    assert n_fp8 == report.dequantised > 0
    assert out[KV_A].shape == (48 + 8, 200)

    idx = json.loads((dst / "model.safetensors.index.json").read_text())
    assert idx["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in out.values())
    for name, fname in idx["weight_map"].items():
        with safe_open(dst / fname, "pt") as f:
            assert name in f.keys()  # noqa: SIM118 (safe_open is not a dict)
    assert set(idx["weight_map"]) == set(out)

    cfg = json.loads((dst / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["num_nextn_predict_layers"] == 0
    assert cfg["hidden_size"] == 200
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (dst / f).read_bytes() == (fp8_ckpt / f).read_bytes()
    assert not list(dst.glob("*.partial"))


def _rewrite(path: Path, edit) -> None:
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


def test_missing_scale_fails_naming_tensor_and_file(fp8_ckpt, tmp_path):
    root = _copy(fp8_ckpt, tmp_path / "src")
    wm_path = root / "model.safetensors.index.json"
    idx = json.loads(wm_path.read_text())
    sfile = idx["weight_map"].pop(KV_A + "_scale_inv")
    wm_path.write_text(json.dumps(idx))
    _rewrite(root / sfile, lambda t: t.pop(KV_A + "_scale_inv"))
    with pytest.raises(WeightsError, match=rf"{idx['weight_map'][KV_A]}.*{KV_A}.*no scale"):
        convert_fp8_to_bf16(root, tmp_path / "out", progress=False)
    assert not list((tmp_path / "out").glob("*.safetensors"))


def test_misshaped_scale_fails(fp8_ckpt, tmp_path):
    root = _copy(fp8_ckpt, tmp_path / "src")
    sfile = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"][KV_A + "_scale_inv"]

    def edit(t):
        t[KV_A + "_scale_inv"] = torch.ones(1, 1)  # [56, 200] needs [1, 2]: the partial edge block is missing

    _rewrite(root / sfile, edit)
    with pytest.raises(
        WeightsError, match=rf"{sfile}: scale {KV_A}_scale_inv has shape \[1, 1\], expected \[1, 2\]"
    ):
        convert_fp8_to_bf16(root, tmp_path / "out", progress=False)


def test_truncated_shard_fails(fp8_ckpt, tmp_path):
    root = _copy(fp8_ckpt, tmp_path / "src")
    f = root / "model-00002-of-00007.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(WeightsError, match="model-00002-of-00007.safetensors: truncated"):
        convert_fp8_to_bf16(root, tmp_path / "out", progress=False)


def test_interrupted_run_resumes_to_identical_bytes(fp8_ckpt, tmp_path, monkeypatch):
    ref = tmp_path / "ref"
    convert_fp8_to_bf16(fp8_ckpt, ref, progress=False)

    out = tmp_path / "out"
    calls = {"n": 0}
    real = fp8_to_bf16._drain_one

    def dying(*a, **k):
        calls["n"] += 1
        if calls["n"] == 40:
            raise KeyboardInterrupt("killed")
        return real(*a, **k)

    monkeypatch.setattr(fp8_to_bf16, "_drain_one", dying)
    with pytest.raises(KeyboardInterrupt):
        convert_fp8_to_bf16(fp8_ckpt, out, band_bytes=4 << 10, progress=False)
    monkeypatch.setattr(fp8_to_bf16, "_drain_one", real)
    done_before = {p.name for p in out.glob("*.safetensors")}
    assert 0 < len(done_before) < 7
    report = convert_fp8_to_bf16(fp8_ckpt, out, progress=False)
    assert set(report.files_skipped) == done_before
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in ref.iterdir())
    for p in ref.iterdir():
        if p.name != fp8_to_bf16.STATE_NAME:
            assert (out / p.name).read_bytes() == p.read_bytes(), p.name


def test_resume_refuses_other_source(fp8_ckpt, tmp_path):
    out = tmp_path / "out"
    convert_fp8_to_bf16(fp8_ckpt, out, progress=False)
    other = tmp_path / "other"
    synthetic.write_checkpoint(other, synthetic.tiny_config(num_hidden_layers=2), fp8=True)
    with pytest.raises(WeightsError, match="different source"):
        convert_fp8_to_bf16(other, out, progress=False)


def test_cli_reports_user_error_without_traceback(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "tools.weights", "fp8-to-bf16", str(tmp_path / "nope"), str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "nope" in r.stderr and "model.safetensors" in r.stderr


def test_fix_config_cli(tmp_path):
    cfg = synthetic.tiny_config()
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = subprocess.run(
        [sys.executable, "-m", "tools.weights", "fix-config", str(tmp_path), str(tmp_path / "fixed.json")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "removed quantization_config" in r.stdout and "num_nextn_predict_layers: 1 -> 0" in r.stdout
    fixed = json.loads((tmp_path / "fixed.json").read_text())
    assert fixed == {k: v for k, v in cfg.items() if k != "quantization_config"} | {
        "num_nextn_predict_layers": 0
    }


def test_dequantize_every_fp8_bit_pattern():
    """All 256 codes (both signs, subnormals, NaN) under varied scales, against torch's own fp8 cast."""
    idx = (torch.arange(512)[:, None] * 7 + torch.arange(512)[None, :]) % 256  # every row: each code twice
    q = idx.to(torch.uint8).view(torch.float8_e4m3fn)
    s = torch.tensor(
        [[1e-3, 3.0, 0.7, 250.0], [2.0**-20, 1.0, 1e-7, 12.5], [5.0, 0.1, 1e3, 2.0**-3], [1.0] * 4]
    )
    got = dequantize_rows(q, s, 0)
    ref = reference_dequant(q, s)
    nan = torch.isnan(ref)
    assert nan.sum() == 512 * 2 * 2  # codes 0x7F and 0xFF, twice per row
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan], ref[~nan])
    assert (ref[~nan] != 0).sum() > 512 * 400  # subnormal products did not all flush to zero
