"""HF -> Megatron torch_dist, proven with megatron-core 0.12.1 loading it exactly as verl does."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tools.weights import mcore_save, synthetic
from tools.weights.errors import WeightsError
from tools.weights.fp8_to_bf16 import convert_fp8_to_bf16
from tools.weights.mcore_save import convert_hf_to_mcore

REPO = Path(__file__).resolve().parents[3]
HELPER = Path(__file__).with_name("megatron_cpu.py")
KV_A = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
SMALL = {"chunk_bytes": 8 << 10, "file_bytes": 100_000, "progress": False}  # many chunks and files


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mcore")
    cfg = synthetic.tiny_config()
    synthetic.write_checkpoint(root / "fp8", cfg, fp8=True, scale_elsewhere=KV_A)
    convert_fp8_to_bf16(root / "fp8", root / "bf16", progress=False)
    r_bf16 = convert_hf_to_mcore(root / "bf16", root / "mc_bf16", **SMALL)
    r_fp8 = convert_hf_to_mcore(root / "fp8", root / "mc_fp8", **SMALL)
    return {"root": root, "fp8": root / "fp8", "bf16": root / "bf16", "mc": root / "mc_fp8",
            "mc_bf16": root / "mc_bf16", "report": r_fp8, "report_bf16": r_bf16}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_megatron(
    ckpt: Path, hf: Path, out: Path, world: int, tp=1, pp=1, ep=1, logits=False, save=None
) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    common = [
        "--ckpt",
        str(ckpt),
        "--hf",
        str(hf),
        "--out",
        str(out),
        "--world",
        str(world),
        "--port",
        str(port),
    ]
    common += ["--tp", str(tp), "--pp", str(pp), "--ep", str(ep)]
    common += ["--logits"] if logits else []
    common += ["--save", str(save)] if save else []
    if save:
        Path(save).mkdir(parents=True)
    procs = [
        subprocess.Popen(
            [sys.executable, str(HELPER), *common, "--rank", str(r)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def _assert_loaded(reports: list[dict], expected_keys: set[str]) -> None:
    problems = [p for r in reports for p in r["problems"]]
    assert not problems, problems[:20]
    seen = set().union(*(r["seen"] for r in reports))
    assert seen == expected_keys


def _planned_keys(ckpts) -> set[str]:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = FileSystemReader(str(ckpts["mc"])).read_metadata()
    return {k for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}


@pytest.mark.megatron
@pytest.mark.every_stack  # the converter against each stack's megatron-core
def test_tp1_load_like_verl_and_logits_match_transformers(ckpts, tmp_path):
    reports = run_megatron(ckpts["mc"], ckpts["bf16"], tmp_path, world=1, logits=True)
    _assert_loaded(reports, _planned_keys(ckpts))
    assert reports[0]["params"] == ckpts["report"].params

    from transformers import DeepseekV3ForCausalLM

    got = torch.load(tmp_path / "logits.pt")
    model = DeepseekV3ForCausalLM.from_pretrained(ckpts["bf16"], torch_dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(got["ids"]).logits
    assert got["logits"].shape == want.shape
    assert torch.allclose(got["logits"], want, atol=1e-4, rtol=1e-4), (got["logits"] - want).abs().max()
    assert want.abs().max() > 0.1  # a real signal, not all zeros


@pytest.mark.megatron
@pytest.mark.every_stack  # the converter against each stack's megatron-core
@pytest.mark.slow
@pytest.mark.parametrize(
    "layout", [dict(tp=2), dict(ep=2), dict(pp=2), dict(tp=2, ep=2)], ids=["tp2", "ep2", "pp2", "tp2ep2"]
)
def test_other_layouts_load_like_verl(ckpts, tmp_path, layout):
    world = 2 if len(layout) == 1 else 4
    saved = tmp_path / "saved_by_megatron" if layout.get("tp") == 2 else None
    reports = run_megatron(ckpts["mc"], ckpts["bf16"], tmp_path, world=world, save=saved, **layout)
    _assert_loaded(reports, _planned_keys(ckpts))
    if saved is None:
        return
    # Megatron's own save in this layout (TP-split rows and columns, EP-split experts): our export
    # must give back the HF tensors bit for bit, as after training
    from safetensors.torch import load_file

    from tools.weights.mcore_to_hf import export_mcore_to_hf

    export_mcore_to_hf(saved, ckpts["bf16"], tmp_path / "hf", band_bytes=4096, progress=False)
    got, want = {}, {}
    for f in (tmp_path / "hf").glob("*.safetensors"):
        got.update(load_file(f))
    for f in ckpts["bf16"].glob("*.safetensors"):
        want.update({k: v for k, v in load_file(f).items() if not k.startswith("model.layers.3.")})
    assert set(got) == set(want)
    # the model holds fp32 parameters, so megatron saved fp32: compare values exactly after the cast
    for k, v in want.items():
        assert torch.equal(got[k].to(v.dtype), v), k


def test_fp8_and_bf16_sources_give_identical_checkpoints(ckpts):
    a, b = ckpts["mc"], ckpts["mc_bf16"]
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert any(n.endswith(".distcp") for n in names) and {".metadata", "common.pt", "metadata.json"} <= set(
        names
    )
    for n in names:
        if n != mcore_save.STATE_NAME:
            assert (a / n).read_bytes() == (b / n).read_bytes(), n
    assert json.loads((a / "metadata.json").read_text())["sharded_backend"] == "torch_dist"


def test_mtp_skipped_and_reported(ckpts):
    index = json.loads((ckpts["fp8"] / "model.safetensors.index.json").read_text())["weight_map"]
    mtp = {n for n in index if n.startswith("model.layers.3.")}
    assert mtp and set(ckpts["report"].skipped) == mtp


def test_file_cap_respected(ckpts):
    sizes = [p.stat().st_size for p in ckpts["mc"].glob("*.distcp")]
    assert len(sizes) > 5
    assert max(sizes) < 100_000 + (8 << 10) + 4096  # cap, plus at most one chunk and torch.save framing


def test_hole_in_coverage_is_refused(ckpts, tmp_path):
    def drop(plan):
        plan.tensors["decoder.layers.1.mlp.experts.experts.linear_fc1.weight"].pieces.pop(3)

    with pytest.raises(WeightsError, match=r"experts.experts.linear_fc1.weight .*hole"):
        convert_hf_to_mcore(ckpts["bf16"], tmp_path / "out", plan_hook=drop, **SMALL)


def test_overlap_is_refused(ckpts, tmp_path):
    def dup(plan):
        t = plan.tensors["embedding.word_embeddings.weight"]
        t.pieces.append(t.pieces[0])

    with pytest.raises(WeightsError, match=r"embedding.word_embeddings.weight .*covered 2 times"):
        convert_hf_to_mcore(ckpts["bf16"], tmp_path / "out", plan_hook=dup, **SMALL)


def test_missing_key_is_refused(ckpts, tmp_path):
    from safetensors.torch import load_file, save_file

    src = tmp_path / "src"
    src.mkdir()
    for p in ckpts["bf16"].iterdir():
        (src / p.name).write_bytes(p.read_bytes())
    idx = json.loads((src / "model.safetensors.index.json").read_text())
    name = "model.layers.2.mlp.experts.1.down_proj.weight"
    f = idx["weight_map"].pop(name)
    (src / "model.safetensors.index.json").write_text(json.dumps(idx))
    t = load_file(src / f)
    del t[name]
    save_file(t, src / f)
    with pytest.raises(WeightsError, match=rf"missing from the checkpoint, first {name}"):
        convert_hf_to_mcore(src, tmp_path / "out", **SMALL)


def test_truncated_source_is_refused(ckpts, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for p in ckpts["fp8"].iterdir():
        (src / p.name).write_bytes(p.read_bytes())
    f = src / "model-00003-of-00007.safetensors"
    f.write_bytes(f.read_bytes()[:-1])
    with pytest.raises(WeightsError, match="model-00003-of-00007.safetensors: truncated"):
        convert_hf_to_mcore(src, tmp_path / "out", **SMALL)


def test_interrupted_run_resumes_to_identical_bytes(ckpts, tmp_path, monkeypatch):
    out = tmp_path / "out"
    real = mcore_save.PlanSavePlanner.resolve_data
    calls = {"n": 0}

    def dying(self, item):
        calls["n"] += 1
        if calls["n"] == 120:
            raise KeyboardInterrupt("killed")
        return real(self, item)

    monkeypatch.setattr(mcore_save.PlanSavePlanner, "resolve_data", dying)
    with pytest.raises(KeyboardInterrupt):
        convert_hf_to_mcore(ckpts["fp8"], out, threads=1, **SMALL)
    monkeypatch.setattr(mcore_save.PlanSavePlanner, "resolve_data", real)
    assert not (out / ".metadata").exists()
    partial = {p.name for p in out.glob("*.distcp")}
    assert partial
    report = convert_hf_to_mcore(ckpts["fp8"], out, threads=2, **SMALL)
    assert report.files_skipped == len(partial)
    ref = ckpts["mc"]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in ref.iterdir())
    for p in ref.iterdir():
        assert (out / p.name).read_bytes() == p.read_bytes(), p.name


def test_refuses_non_empty_foreign_directory(ckpts, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(WeightsError, match="not empty"):
        convert_hf_to_mcore(ckpts["bf16"], tmp_path / "out", **SMALL)


def test_cli_converts_and_lists_every_skipped_tensor(ckpts, tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.weights",
            "hf-to-mcore",
            str(ckpts["fp8"]),
            str(tmp_path / "mc"),
            "--file-mb",
            "1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    listed = {line.strip() for line in r.stdout.splitlines() if line.startswith("  ")}
    assert listed == set(ckpts["report"].skipped)
    assert f"skipped {len(listed)} tensors" in r.stdout
    assert f"{ckpts['report'].params:,} parameters" in r.stdout
    assert (tmp_path / "mc" / ".metadata").is_file() and (tmp_path / "mc" / "metadata.json").is_file()
