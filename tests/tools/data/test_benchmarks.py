"""The shipped benchmarks: their bytes (sha256), counts, known answers, the loader's refusals, and their
conversion to verl's parquet with the recipes' prompt template."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tools.data.benchmarks import (
    BENCHMARKS,
    BENCHMARKS_DIR,
    BenchmarkError,
    load_benchmark,
    repair_lost_escapes,
    sha256_of,
    write_benchmarks,
)
from tools.data.cli import main
from tools.data.schema import validate_parquet
from tools.data.template import R1_ZERO_INSTRUCTION
from tools.errors import exit_status

# the sha256 of each file as fetched, written here a second time on purpose: a change to a benchmark
# file must be made knowingly in three places (the file, BENCHMARKS, this test), never by accident
FETCHED = {
    "aime24": "af2b8bd2aa911b6333ad0df32f3ca05c7ae8ed10f1731f4372c8ae26990bf7ac",
    "aime25": "b4e273c02d3e7fe1b74b59eae768fc8230bfb0f79539890cb56f4361caac0331",
    "math500": "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
}


@pytest.mark.parametrize("name", sorted(FETCHED))
def test_file_bytes_are_those_fetched(name: str) -> None:
    spec = BENCHMARKS[name]
    assert sha256_of(BENCHMARKS_DIR / spec.file) == FETCHED[name] == spec.sha256
    # the provenance file states the same checksum
    assert FETCHED[name] in (BENCHMARKS_DIR / name / "README.md").read_text()
    assert FETCHED[name] in (BENCHMARKS_DIR / "README.md").read_text()


def test_counts_and_known_answers() -> None:
    aime24, aime25, math500 = (load_benchmark(n) for n in ("aime24", "aime25", "math500"))
    assert (len(aime24), len(aime25), len(math500)) == (30, 30, 500)
    # AIME 2024 I problem 1 (Aya's walk) is 204; AIME 2025 I-1 70, I-15 735, II-1 468, II-15 240
    assert aime24[0].answer == "204" and "Aya" in aime24[0].problem
    by_id = {p.id: p.answer for p in aime25}
    assert (by_id["0"], by_id["14"], by_id["15"], by_id["29"]) == ("70", "735", "468", "240")
    assert math500[0].id == "test/precalculus/807.json"
    assert math500[0].answer == r"\left( 3, \frac{\pi}{2} \right)"
    for problems in (aime24, aime25):  # AIME answers are integers 0..999
        assert all(re.fullmatch(r"\d{1,3}", p.answer) for p in problems)


def test_aime25_lost_escapes_are_repaired_and_math500_tabs_kept() -> None:
    for name in BENCHMARKS:
        if BENCHMARKS[name].repair_escapes:
            assert not any(re.search(r"[\x08\x0c\t\r][A-Za-z]", p.problem) for p in load_benchmark(name))
    p18 = {p.id: p for p in load_benchmark("aime25")}["18"].problem
    assert p18.count("\\frac") == 5 and "\x0c" not in p18
    assert "\\triangle DEF" in {p.id: p for p in load_benchmark("aime25")}["19"].problem
    # MATH-500's Asymptote code has real tabs: never "repaired"
    asy = {p.id: p for p in load_benchmark("math500")}["test/precalculus/1199.json"].problem
    assert "\treturn" in asy
    assert repair_lost_escapes("a \x0crac{1}{2} \triangle") == "a \\frac{1}{2} \\triangle"


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "benchmarks"
    shutil.copytree(BENCHMARKS_DIR, root)
    return root


def test_altered_file_is_refused_naming_file_expected_found_and_fix(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    f = root / "aime24" / "test.jsonl"
    f.write_bytes(f.read_bytes().replace(b'"answer":"204"', b'"answer":"205"', 1))
    with pytest.raises(BenchmarkError) as e:
        load_benchmark("aime24", root)
    msg = str(e.value)
    assert str(f) in msg and FETCHED["aime24"] in msg and sha256_of(f) in msg
    assert "fix: restore the file from git" in msg


def test_missing_file_and_unknown_name_are_refused(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (root / "math500" / "test.jsonl").unlink()
    with pytest.raises(BenchmarkError, match="benchmark 'math500' is missing"):
        load_benchmark("math500", root)
    with pytest.raises(BenchmarkError, match="(?s)unknown benchmark .aime26.*aime24, aime25, math500"):
        load_benchmark("aime26")


def test_parquet_has_the_recipe_template_and_reference_answers(tmp_path: Path) -> None:
    paths = write_benchmarks(tmp_path)
    assert [p.name for p in paths] == ["aime24.parquet", "aime25.parquet", "math500.parquet"]
    for path in paths:
        name = path.stem
        assert validate_parquet(path) == []
        rows = pq.read_table(path).to_pylist()
        problems = load_benchmark(name)
        assert len(rows) == len(problems)
        for row, p in zip(rows, problems, strict=True):
            assert row["data_source"] == name
            assert row["reward_model"] == {"style": "rule", "ground_truth": p.answer}
            assert row["prompt"] == [
                {"role": "system", "content": R1_ZERO_INSTRUCTION},
                {"role": "user", "content": p.problem},
            ]


def test_cli_writes_the_named_benchmarks_and_refuses_an_unknown_one(tmp_path: Path, capsys) -> None:
    assert exit_status(main, ["benchmarks", str(tmp_path / "b"), "--names", "aime25"]) == 0
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["aime25.parquet"]
    assert exit_status(main, ["benchmarks", str(tmp_path / "c"), "--names", "aime24,nope"]) == 2
    assert "unknown benchmark 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
