"""tools/records.py: the one JSONL reader (a torn last line skipped) and the one parser of verl's
validation metric names that the analyses and the report use."""

from __future__ import annotations

from pathlib import Path

from tools.records import ValidationKey, is_accuracy, read_json, read_jsonl, validation_key


def test_a_torn_line_is_skipped_and_only_objects_kept(tmp_path: Path) -> None:
    f = tmp_path / "m.jsonl"
    f.write_text('{"step": 1}\n[1, 2]\n{"step": 2}\n{"step": 3, "da')
    assert read_jsonl(f) == [{"step": 1}, {"step": 2}]
    assert read_jsonl(f, keep=lambda r: isinstance(r, dict) and r["step"] > 1) == [{"step": 2}]
    assert read_json(tmp_path / "missing.json") is None
    (tmp_path / "bad.json").write_text("{")
    assert read_json(tmp_path / "bad.json") is None


def test_validation_keys() -> None:
    assert validation_key("val-core/addition-3d/acc/mean@4") == ValidationKey("core", "addition-3d", "acc", 4)
    assert validation_key("val-aux/a/b/trace/mean@8") == ValidationKey("aux", "a/b", "trace", 8)
    assert validation_key("val-core/addition/acc/best@4/mean") is None
    assert validation_key("critic/score/mean") is None
    assert is_accuracy("val-core/addition/acc/mean@8")
    assert not is_accuracy("val-aux/addition/acc/mean@8") and not is_accuracy(
        "val-core/addition/format/mean@8"
    )
