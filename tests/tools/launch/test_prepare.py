"""`make prepare`: a tiny FP8 DeepSeek-V3 download and a raw DeepScaleR file taken through the flagship
recipe's chain (FP8 -> BF16, config fix-up, HF -> Megatron, dataset), interrupted and resumed, and a
second run that skips everything."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tools.data import synthetic as D
from tools.launch import prepare as PR
from tools.weights import synthetic as S

RECIPE = "deepseek-v3-671b-a3"


def _download(root: Path) -> Path:
    S.write_checkpoint(
        root / "DeepSeek-V3-Base", S.tiny_config(), fp8=True
    )  # 7 FP8 shards, MTP layer included
    D.write_json(D.deepscaler_rows(120), root / "deepscaler.json")
    return root


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        # resume records and the data card name their own paths
        if p.is_file() and not p.name.endswith(".state.json") and p.name != "data_card.md"
    }


@pytest.fixture
def reference(tmp_path_factory) -> dict[str, dict[str, str]]:
    """Outputs of one uninterrupted run."""
    root = _download(tmp_path_factory.mktemp("ref"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ASCEND_R1_DATA", str(root))
        summary = PR.prepare(RECIPE, log=lambda s: None)
    assert [o.status for o in summary.outcomes] == [PR.DONE, PR.SKIPPED, PR.DONE, PR.DONE, PR.DONE]
    # fp8-to-bf16 already fixes config.json, so the fix-config step finds nothing to do
    return {
        d: _digest(root / d)
        for d in ("DeepSeek-V3-bf16", "DeepSeek-V3-mcore", "data/deepscaler", "data/benchmarks")
    }


@pytest.mark.slow
def test_interrupted_then_resumed_then_all_skipped(tmp_path, monkeypatch, reference):
    root = _download(tmp_path)
    monkeypatch.setenv("ASCEND_R1_DATA", str(root))
    # Ctrl-C while the third BF16 shard is being committed
    import tools.weights.fp8_to_bf16 as f2b

    real_commit, calls = f2b.atomic.commit, []

    def interrupted(tmp, path):
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real_commit(tmp, path)

    monkeypatch.setattr(f2b.atomic, "commit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        PR.prepare(RECIPE, log=lambda s: None)
    monkeypatch.setattr(f2b.atomic, "commit", real_commit)
    bf16 = root / "DeepSeek-V3-bf16"
    state = json.loads((bf16 / "fp8-to-bf16.state.json").read_text())
    assert 1 <= len(state["done"]) < 7 and not (bf16 / "model.safetensors.index.json").exists()
    assert not (root / "DeepSeek-V3-mcore").exists() and not (root / "data").exists()

    lines: list[str] = []
    summary = PR.prepare(RECIPE, log=lines.append)
    status = {o.name: o for o in summary.outcomes}
    assert status["bf16"].status == PR.RESUMED
    assert (
        f"{7 - len(state['done'])} shards written, {len(state['done'])} kept from an earlier run"
        in status["bf16"].detail
    )
    assert any("bf16" in x and "resuming an interrupted run" in x for x in lines)
    assert status["mcore"].status == PR.DONE and status["data"].status == PR.DONE
    # the resumed outputs are byte for byte those of the uninterrupted run
    for d, digest in reference.items():
        assert _digest(root / d) == digest, d

    again = PR.prepare(RECIPE, log=lambda s: None)
    assert [o.status for o in again.outcomes] == [PR.SKIPPED] * 5
    assert "summary" in again.render() and "skipped (complete)" in again.render()


def test_missing_inputs_are_named_with_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCEND_R1_DATA", str(tmp_path))
    with pytest.raises(PR.PrepareError) as e:
        PR.prepare(RECIPE, log=lambda s: None)
    msg = str(e.value)
    assert (
        f"download the Hugging Face files to {tmp_path}/DeepSeek-V3-bf16 or the FP8 release to {tmp_path}/DeepSeek-V3-Base"
        in msg
    )
    assert f"put the raw file at {tmp_path}/deepscaler.json" in msg and "never done by this tool" in msg


def test_steps_follow_the_recipe(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCEND_R1_DATA", str(tmp_path))
    from tools.launch.recipe import compose

    qwen = {s.name: s for s in PR.steps_for(compose("qwen2.5-7b-a2"))}
    assert not qwen["bf16"].needed and not qwen["fix-config"].needed and not qwen["mcore"].needed
    assert qwen["data"].needed
    flagship = {s.name: s for s in PR.steps_for(compose(RECIPE))}
    assert flagship["mcore"].needed and flagship["fix-config"].needed
    # the validation set the recipe names (verl.data.val_files) is what the benchmarks step writes
    assert flagship["benchmarks"].needed and qwen["benchmarks"].needed
    val = Path(compose(RECIPE).verl.data.val_files)
    assert (
        val == tmp_path / "data" / "benchmarks" / "aime24.parquet" == flagship["benchmarks"].output / val.name
    )
    assert flagship["benchmarks"].run() == "aime24.parquet, aime25.parquet, math500.parquet"
    assert flagship["benchmarks"].complete() and val.is_file()
    assert not {s.name: s for s in PR.steps_for(compose("tiny-cpu"))}["benchmarks"].needed
