"""Checkpoint manifests, verified resume and records that agree with the checkpoint (a resumed run keeps its records straight)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.launch import checkpoints, resume
from tools.launch.checkpoints import CheckpointError


def _save(ckpt: Path, step: int, payload: bytes = b"x" * 1000, seal: bool = True) -> Path:
    """A checkpoint as verl writes it (Megatron dist_ckpt files + the tracker), sealed as the launcher does."""
    d = ckpt / f"global_step_{step}"
    (d / "actor" / "model" / "dist_ckpt").mkdir(parents=True)
    (d / "actor" / "model" / "dist_ckpt" / "__0_0.distcp").write_bytes(payload + bytes([step]))
    (d / "actor" / "model" / "dist_ckpt" / ".metadata").write_bytes(b"meta")
    (d / "data.pt").write_bytes(b"loader")
    (ckpt / checkpoints.TRACKER).write_text(str(step))
    if seal:
        checkpoints.write_manifest(d)
    return d


def _records(run: Path, steps: range) -> None:
    rows = [{"step": 0, "kind": "validation", "attempt": 1, "metrics": {"val-core/acc": 0.1}}]
    for s in steps:
        rows.append({"step": s, "kind": "train", "attempt": 1, "metrics": {"timing_s/step": 1.0}})
    rows.append({"step": steps[-1], "kind": "validation", "attempt": 1, "metrics": {"val-core/acc": 0.2}})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _prepare(run: Path, lines: list[str], **kw) -> int:
    args = {"fresh": False, "resume_from": None, **kw}
    return resume.prepare(
        run, recipe="tiny-cpu", stack="current", overrides=[], log=lines.append, redraw=None, **args
    )


def test_manifest_lists_every_file_and_verify_names_damage(tmp_path: Path) -> None:
    d = _save(tmp_path, 3)
    m = json.loads((d / "manifest.json").read_text())
    assert m["mode"] == "digest"
    assert {e["path"] for e in m["files"]} == {
        "actor/model/dist_ckpt/__0_0.distcp",
        "actor/model/dist_ckpt/.metadata",
        "data.pt",
    }
    assert checkpoints.verify(d) == []
    distcp = d / "actor/model/dist_ckpt/__0_0.distcp"
    distcp.write_bytes(distcp.read_bytes()[:500])
    (problem,) = checkpoints.verify(d)
    assert str(distcp) in problem and "truncated: 500 bytes, the manifest says 1001" in problem
    distcp.write_bytes(b"y" * 1001)  # same size, other bytes
    (problem,) = checkpoints.verify(d)
    assert "changed" in problem
    (d / "data.pt").unlink()
    assert any(str(d / "data.pt") in p and "missing" in p for p in checkpoints.verify(d))


def test_size_only_manifest_above_the_digest_limit(tmp_path: Path) -> None:
    d = _save(tmp_path, 1, seal=False)
    m = checkpoints.write_manifest(d, digest_limit_gb=0)
    assert m["mode"] == "size" and all("blake2b" not in e for e in m["files"])
    distcp = d / "actor/model/dist_ckpt/__0_0.distcp"
    distcp.write_bytes(distcp.read_bytes()[:10])
    assert "truncated" in checkpoints.verify(d)[0]


def test_seal_new_seals_only_finished_saves(tmp_path: Path) -> None:
    _save(tmp_path, 2, seal=False)
    _save(tmp_path, 4, seal=False)
    d6 = _save(tmp_path, 6, seal=False)
    (tmp_path / checkpoints.TRACKER).write_text("4")  # the save of step 6 was cut off
    lines: list[str] = []
    assert checkpoints.seal_new(tmp_path, after=2, log=lines.append) == [4]
    assert not (tmp_path / "global_step_2" / "manifest.json").exists()  # not this run's
    assert not (d6 / "manifest.json").exists()
    assert any("global_step_6" in line and "did not finish" in line for line in lines)


def test_resume_uses_the_tracked_checkpoint_and_says_it_verified_it(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    _save(ckpt, 2)
    _save(ckpt, 4)
    _records(tmp_path, range(1, 5))
    lines: list[str] = []
    assert _prepare(tmp_path, lines) == 4
    assert any("global_step_4: verified" in line for line in lines)
    assert not (tmp_path / "metrics.jsonl.dropped").exists()


def test_damaged_checkpoint_is_named_and_the_last_intact_one_offered(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    _save(ckpt, 2)
    d4 = _save(ckpt, 4)
    distcp = d4 / "actor/model/dist_ckpt/__0_0.distcp"
    distcp.write_bytes(distcp.read_bytes()[:100])
    with pytest.raises(CheckpointError) as e:
        _prepare(tmp_path, [])
    text = str(e.value)
    assert f"checkpoint {d4} is damaged: {distcp}: truncated: 100 bytes" in text.splitlines()[0]
    assert "make train RECIPE=tiny-cpu ARGS='--resume-from=2'" in text
    assert "make train RECIPE=tiny-cpu ARGS='--fresh'" in text
    assert checkpoints.tracked_step(ckpt) == 4  # nothing changed before the user chose
    assert d4.is_dir()


def test_resume_from_an_earlier_checkpoint_sets_later_ones_and_records_aside(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    _save(ckpt, 2)
    d4 = _save(ckpt, 4)
    (d4 / "data.pt").unlink()  # damaged
    _records(tmp_path, range(1, 5))
    lines: list[str] = []
    assert _prepare(tmp_path, lines, resume_from=2) == 2
    assert any("global_step_2: verified against its manifest" in x for x in lines)
    assert checkpoints.tracked_step(ckpt) == 2  # verl resumes from what was verified
    assert not d4.exists() and list((ckpt / "dropped").glob("*/global_step_4"))
    kept = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["kind"]) for r in kept] == [(0, "validation"), (1, "train"), (2, "train")]
    dropped = [json.loads(x) for x in (tmp_path / "metrics.jsonl.dropped").read_text().splitlines()]
    assert sorted({r["step"] for r in dropped}) == [3, 4]
    assert any("kept steps 1..2; dropped steps 3..4" in line for line in lines)


def test_a_cut_off_save_is_ignored_and_the_tracked_checkpoint_used(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    _save(ckpt, 2)
    _save(ckpt, 4)
    _save(ckpt, 6, seal=False)
    (ckpt / checkpoints.TRACKER).write_text("4")  # the save of step 6 was cut off: verl never tracked it
    _records(tmp_path, range(1, 7))
    lines: list[str] = []
    assert _prepare(tmp_path, lines) == 4
    assert any("global_step_6: its save did not finish (verl's tracker says 4): not used" in x for x in lines)
    assert checkpoints.tracked_step(ckpt) == 4
    assert [p.name for p in (ckpt / "dropped").glob("*/*")] == ["global_step_6"]
    assert any("kept steps 1..4; dropped steps 5..6" in x for x in lines)


def test_an_unsealed_tracked_checkpoint_is_the_users_call(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    _save(ckpt, 2)
    d4 = _save(ckpt, 4, seal=False)  # verl finished it, the launcher was killed before sealing it
    with pytest.raises(CheckpointError) as e:
        _prepare(tmp_path, [])
    text = str(e.value)
    assert f"checkpoint {d4} has no manifest: verl finished it" in text
    assert f"python -m tools.launch.checkpoints seal {d4}" in text
    assert "ARGS='--resume-from=2'" in text and "ARGS='--fresh'" in text
    assert d4.is_dir() and checkpoints.tracked_step(ckpt) == 4  # nothing moved before the user chose
    assert checkpoints.main(["seal", str(d4)]) == 0
    assert _prepare(tmp_path, []) == 4


def test_fresh_sets_every_checkpoint_and_record_aside(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    _save(ckpt, 3)
    _records(tmp_path, range(1, 4))
    redrawn: list[list[dict]] = []
    step = resume.prepare(
        tmp_path,
        fresh=True,
        resume_from=None,
        recipe="tiny-cpu",
        stack="current",
        overrides=[],
        log=lambda m: None,
        redraw=redrawn.append,
    )
    assert step == 0
    assert not (ckpt / checkpoints.TRACKER).exists() and not (ckpt / "global_step_3").exists()
    assert [r["step"] for r in redrawn[0]] == [0]


def test_resume_from_a_missing_or_unsealed_step_is_refused(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    _save(ckpt, 2)
    _save(ckpt, 4, seal=False)
    with pytest.raises(
        CheckpointError, match=r"no checkpoint .*global_step_9.*\n  fix: pick one of the sealed steps \[2\]"
    ):
        _prepare(tmp_path, [], resume_from=9)
    with pytest.raises(
        CheckpointError,
        match="has no manifest.*\n  fix: if you trust it: python -m tools.launch.checkpoints seal",
    ):
        _prepare(tmp_path, [], resume_from=4)


def test_cli_verify_and_seal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = _save(tmp_path, 1, seal=False)
    assert checkpoints.main(["seal", str(d)]) == 0
    assert checkpoints.main(["verify", str(d)]) == 0
    (d / "data.pt").write_bytes(b"")
    assert checkpoints.main(["verify", str(d)]) == 1
    assert "data.pt: truncated: 0 bytes" in capsys.readouterr().out
