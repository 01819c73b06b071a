"""An empty, truncated or garbage parquet file, or a missing one: one line naming it, what is wrong, the fix.

Every reader of a user's parquet: `make data` (tools.data convert), `make check-data` (tools.data check),
and `make plan` / `make train` (the planner's data rules, train's step check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.data import synthetic as syn
from tools.data.cli import main as cli_main
from tools.data.convert import Options, convert
from tools.data.parquet import ParquetError, open_parquet
from tools.errors import run_cli


def main(argv: list[str]) -> int:
    """`python -m tools.data ARGV` as a user runs it (its __main__: run_cli), in this process: the status."""
    with pytest.raises(SystemExit) as e:
        run_cli(lambda: cli_main(argv))
    return int(e.value.code)


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("good")
    syn.write_json(syn.deepscaler_rows(20), root / "src.json")
    convert(Options(src=root / "src.json", dst=root / "out", fmt="deepscaler", progress=False))
    return root / "out" / "train.parquet"


def _bad(tmp_path: Path, good: Path) -> dict[str, tuple[Path, str]]:
    (tmp_path / "empty.parquet").write_bytes(b"")
    (tmp_path / "garbage.parquet").write_text("id,problem\n1,what\n")
    (tmp_path / "truncated.parquet").write_bytes(good.read_bytes()[:300])
    return {
        "empty": (tmp_path / "empty.parquet", "empty (0 bytes)"),
        "garbage": (tmp_path / "garbage.parquet", "not a parquet file (18 bytes that do not start with"),
        "truncated": (tmp_path / "truncated.parquet", "truncated (300 bytes: it starts as a parquet file"),
    }


@pytest.mark.parametrize("kind", ["empty", "garbage", "truncated"])
def test_open_parquet_says_what_is_wrong(tmp_path: Path, good: Path, kind: str) -> None:
    path, what = _bad(tmp_path, good)[kind]
    with pytest.raises(ParquetError) as e:
        open_parquet(path)
    assert str(e.value).startswith(f"{path}: {what}")


@pytest.mark.parametrize("kind", ["empty", "garbage", "truncated"])
def test_check_data_and_make_data_name_the_file(
    tmp_path: Path, good: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, what = _bad(tmp_path, good)[kind]
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"error: {path}: {what}") and err[1].startswith("  fix: ") and len(err) == 2
    assert main(["convert", str(path), str(tmp_path / "dst"), "--quiet"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"error: {path}: {what}") and err[1].startswith("  fix: write the parquet file")
    assert len(err) == 2
    assert not (tmp_path / "dst").exists()


def test_the_planner_names_a_damaged_training_file(tmp_path: Path, good: Path) -> None:
    from tools.plan import FAIL, plan

    path, what = _bad(tmp_path, good)["garbage"]
    p = plan("tiny-cpu", [f"verl.data.train_files={path}", f"verl.data.val_files={good}"], check_machine=True)
    (row,) = [r for r in p.results if r.rule.startswith("data present")]
    assert row.status == FAIL
    assert f"{path}: {what}" in row.message
    assert "make data SRC=" in row.message and "verl.data.train_files" in row.message


def test_a_missing_training_file_points_at_make_data_not_make_train(tmp_path: Path, good: Path) -> None:
    from tools.plan import FAIL, plan

    missing = tmp_path / "mine" / "train.parquet"
    p = plan("tiny-cpu", [f"verl.data.train_files={missing}", f"verl.data.val_files={good}"])
    (row,) = [r for r in p.results if r.rule == "data present"]
    assert row.status == FAIL and str(missing) in row.values
    assert f"make data SRC=<your .json, .jsonl or .parquet> DST={missing.parent}" in row.message
    assert "verl.data.train_files" in row.message and "make train" not in row.message


# ---- tokenizer folders ---------------------------------------------------------------------------------


def test_a_missing_empty_or_damaged_tokenizer_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tok = syn.tiny_tokenizer(tmp_path / "tok")
    (tmp_path / "none").mkdir()
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tok.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": ')  # cut off
    cases = {
        tmp_path / "nope": "no such folder",
        tmp_path / "none": "no tokenizer files in it",
        broken: "cannot load the tokenizer (",
    }
    for folder, what in cases.items():
        rc = main(["show-prompt", "--tokenizer", str(folder), "--problem", "What is 1+1?"])
        err = capsys.readouterr().err.splitlines()
        assert rc == 2, (folder, err)
        assert err[0].startswith(f"error: --tokenizer {folder}: {what}"), err
        assert len(err) == 2 and err[1].startswith("  fix: point --tokenizer at a Hugging Face model folder")
