"""Dataset converters: each source format, split/dedupe/filter, errors naming row and field, atomic output."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tools.data import readers
from tools.data import synthetic as syn
from tools.data.cli import main
from tools.data.convert import ConvertError, Options, convert
from tools.data.schema import SCHEMA, validate_parquet
from tools.data.template import R1_ZERO_INSTRUCTION, SHORT_INSTRUCTION
from tools.errors import exit_status


def rows_of(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return syn.tiny_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.mark.parametrize(
    ("fmt", "make", "expected_answer"),
    [
        ("deepscaler", syn.deepscaler_rows, lambda r: r["answer"]),
        ("math", syn.math_rows, lambda r: r["solution"].split("\\boxed{", 1)[1][:-3]),
        ("gsm8k", syn.gsm8k_rows, lambda r: r["answer"].split("####")[1].strip().replace(",", "")),
        ("orz", syn.orz_rows, lambda r: r[1]["ground_truth"]["value"]),
    ],
)
def test_each_format_converts_to_verl_schema(tmp_path: Path, fmt: str, make, expected_answer) -> None:
    src = syn.write_json(make(40, seed=1), tmp_path / "src.json")
    res = convert(Options(src=src, dst=tmp_path / "out", fmt=fmt, progress=False))
    out = tmp_path / "out" / "train.parquet"
    assert validate_parquet(out) == []
    assert pq.read_schema(out).equals(SCHEMA)
    got = rows_of(out)
    assert res.counts["train"] == len(got) == 40
    source_rows = make(40, seed=1)
    for r in got:
        src_row = source_rows[r["extra_info"]["source_row"] - 1]
        assert r["reward_model"] == {"style": "rule", "ground_truth": expected_answer(src_row)}
        assert r["prompt"][0] == {"role": "system", "content": R1_ZERO_INSTRUCTION}
        assert r["ability"] == "math"
    assert sorted(r["extra_info"]["index"] for r in got) == list(range(40))
    assert (tmp_path / "out" / "data_card.md").read_text().count("| train | 40 |") == 1
    assert (tmp_path / "out" / "lengths.png").read_bytes()[:4] == b"\x89PNG"


def test_gsm8k_thousands_separator_removed(tmp_path: Path) -> None:
    src = syn.write_json([{"question": "q?", "answer": "work\n#### 1,234"}], tmp_path / "g.jsonl", lines=True)
    convert(Options(src=src, dst=tmp_path / "o", fmt="gsm8k", progress=False))
    assert rows_of(tmp_path / "o" / "train.parquet")[0]["reward_model"]["ground_truth"] == "1234"


def test_user_prefix_style(tmp_path: Path) -> None:
    src = syn.write_json(syn.deepscaler_rows(3), tmp_path / "s.json")
    convert(Options(src=src, dst=tmp_path / "o", style="user", progress=False))
    (msg,) = rows_of(tmp_path / "o" / "train.parquet")[0]["prompt"]
    assert msg["role"] == "user" and msg["content"].startswith(R1_ZERO_INSTRUCTION)
    assert msg["content"].endswith("?")


def test_named_template(tmp_path: Path) -> None:
    """--template short: the one-sentence instruction in place of the R1-Zero preamble, named in the card;
    an unknown name is refused with the list."""
    src = syn.write_json(syn.deepscaler_rows(3), tmp_path / "s.json")
    assert main(["convert", str(src), str(tmp_path / "o"), "--template", "short", "--quiet"]) == 0
    sys_msg, user = rows_of(tmp_path / "o" / "train.parquet")[0]["prompt"]
    assert sys_msg == {"role": "system", "content": SHORT_INSTRUCTION} and user["role"] == "user"
    assert "prompt template `short`" in (tmp_path / "o" / "data_card.md").read_text()
    with pytest.raises(ConvertError, match="'long': one of r1-zero, short"):
        convert(Options(src=src, dst=tmp_path / "p", template="long", progress=False))


def test_seeded_split_is_deterministic_and_disjoint(tmp_path: Path) -> None:
    src = syn.write_json(syn.deepscaler_rows(200), tmp_path / "s.json")
    convert(Options(src=src, dst=tmp_path / "a", seed=7, test_size=0.1, progress=False))
    convert(Options(src=src, dst=tmp_path / "b", seed=7, test_size=0.1, progress=False))
    convert(Options(src=src, dst=tmp_path / "c", seed=8, test_size=0.1, progress=False))
    a_train, a_test = rows_of(tmp_path / "a/train.parquet"), rows_of(tmp_path / "a/test.parquet")
    assert a_train == rows_of(tmp_path / "b/train.parquet") and a_test == rows_of(tmp_path / "b/test.parquet")
    assert [r["extra_info"]["source_row"] for r in a_train] != [
        r["extra_info"]["source_row"] for r in rows_of(tmp_path / "c/train.parquet")
    ]
    assert len(a_test) == 20 and {r["extra_info"]["split"] for r in a_test} == {"test"}
    rows = {r["extra_info"]["source_row"] for r in a_train} | {r["extra_info"]["source_row"] for r in a_test}
    assert rows == set(range(1, 201)) and len(a_train) + len(a_test) == 200


def test_dedupe_counts_repeats_and_conflicts(tmp_path: Path) -> None:
    rows = syn.deepscaler_rows(10)
    rows += [dict(rows[0]), {**rows[1], "problem": "  " + rows[1]["problem"].upper(), "answer": "-1"}]
    src = syn.write_json(rows, tmp_path / "s.json")
    res = convert(Options(src=src, dst=tmp_path / "o", progress=False))
    assert res.counts["duplicates dropped"] == 2
    assert res.counts["... of which with a different answer (first kept)"] == 1
    assert res.counts["train"] == 10
    res = convert(Options(src=src, dst=tmp_path / "o2", dedupe=False, progress=False))
    assert res.counts["train"] == 12


def test_bad_row_names_file_row_field_and_writes_nothing(tmp_path: Path) -> None:
    rows = syn.deepscaler_rows(5)
    rows[2]["answer"] = None
    src = syn.write_json(rows, tmp_path / "s.json")
    with pytest.raises(ConvertError) as e:
        convert(Options(src=src, dst=tmp_path / "out", progress=False))
    msg = str(e.value)
    assert str(src) in msg and "row 3" in msg and "'answer'" in msg and "--skip-bad" in msg
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]  # no partial folder left


def test_skip_bad_counts_reasons(tmp_path: Path) -> None:
    rows = syn.deepscaler_rows(6)
    rows[1]["answer"] = ""
    rows[4]["answer"] = ""
    del rows[5]["problem"]
    src = syn.write_json(rows, tmp_path / "s.json")
    res = convert(Options(src=src, dst=tmp_path / "o", skip_bad=True, progress=False))
    assert res.counts["skipped (malformed)"] == 3 and res.counts["train"] == 3
    assert res.skipped["answer: empty"] == 2
    assert sum(n for reason, n in res.skipped.items() if reason.startswith("problem: missing")) == 1
    assert "2 x answer: empty" in (tmp_path / "o" / "data_card.md").read_text()


def test_invalid_json_line_is_a_bad_row(tmp_path: Path) -> None:
    src = tmp_path / "s.jsonl"
    src.write_text(
        '{"problem": "p1", "answer": "1"}\n{"problem": "p2", "answer": \n{"problem": "p3", "answer": "3"}\n'
    )
    with pytest.raises(ConvertError, match=r"row 2: field '\(line\)': invalid JSON"):
        convert(Options(src=src, dst=tmp_path / "o", progress=False))
    res = convert(Options(src=src, dst=tmp_path / "o", skip_bad=True, progress=False))
    assert res.counts["train"] == 2 and res.counts["skipped (malformed)"] == 1


def test_failure_while_writing_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = syn.write_json(syn.deepscaler_rows(20), tmp_path / "s.json")
    real = pq.write_table

    def flaky(table: pa.Table, where, **kw) -> None:
        if str(where).endswith("test.parquet"):
            raise OSError("disk full")
        real(table, where, **kw)

    monkeypatch.setattr(pq, "write_table", flaky)
    with pytest.raises(OSError, match="disk full"):
        convert(Options(src=src, dst=tmp_path / "o", test_size=5, progress=False))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]


def test_overwrite_needs_flag_and_removes_stale_split(tmp_path: Path) -> None:
    src = syn.write_json(syn.deepscaler_rows(20), tmp_path / "s.json")
    convert(Options(src=src, dst=tmp_path / "o", test_size=5, progress=False))
    with pytest.raises(ConvertError, match="--overwrite"):
        convert(Options(src=src, dst=tmp_path / "o", progress=False))
    convert(Options(src=src, dst=tmp_path / "o", overwrite=True, progress=False))
    assert not (tmp_path / "o" / "test.parquet").exists()
    assert len(rows_of(tmp_path / "o" / "train.parquet")) == 20


def test_length_filter_counts_tokens_like_verl(tmp_path: Path, tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    from tools.data.template import build_prompt

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    all_rows = syn.deepscaler_rows(100)
    # verl's count: the chat template with the generation prompt, tokenized
    lengths = [
        len(
            tok.apply_chat_template(build_prompt(r["problem"]), add_generation_prompt=True, return_dict=False)
        )
        for r in all_rows
    ]
    limit = sorted(lengths)[len(lengths) // 2]
    src = syn.write_json(all_rows, tmp_path / "s.json")
    res = convert(
        Options(
            src=src, dst=tmp_path / "o", tokenizer=str(tokenizer_dir), max_prompt_length=limit, progress=False
        )
    )
    kept = {r["extra_info"]["source_row"] for r in rows_of(tmp_path / "o" / "train.parquet")}
    assert kept == {i for i, n in enumerate(lengths, 1) if n <= limit}
    assert res.counts[f"too long (> {limit} tokens)"] == sum(n > limit for n in lengths) > 0
    assert "Prompt length (tokens)" in (tmp_path / "o" / "data_card.md").read_text()


def test_generic_mapping_jsonl_and_parquet(tmp_path: Path) -> None:
    recs = [{"q": {"text": f"question {i}?"}, "sol": f"so \\boxed{{{i}}}"} for i in range(5)]
    src = syn.write_json(recs, tmp_path / "g.jsonl", lines=True)
    opts = dict(
        fmt="generic", problem_field="q.text", answer_field="sol", answer_from_boxed=True, progress=False
    )
    convert(Options(src=src, dst=tmp_path / "a", **opts))
    pq.write_table(pa.Table.from_pylist(recs), tmp_path / "g.parquet")
    convert(Options(src=tmp_path / "g.parquet", dst=tmp_path / "b", **opts))
    a, b = rows_of(tmp_path / "a/train.parquet"), rows_of(tmp_path / "b/train.parquet")
    assert a == [{**r, "data_source": "g"} for r in b]
    assert sorted(r["reward_model"]["ground_truth"] for r in a) == [str(i) for i in range(5)]
    with pytest.raises(ConvertError, match="row 1: field 'q.nope'"):
        convert(Options(src=src, dst=tmp_path / "c", **{**opts, "problem_field": "q.nope"}))


@pytest.mark.parametrize("chunk", [1, 5, 64, 1 << 20])
def test_streaming_json_array_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    monkeypatch.setattr(readers, "CHUNK", chunk)
    rows = [*syn.deepscaler_rows(30), 12345, "a]b,", [1, {"x": "}"}], None]
    path = syn.write_json(rows, tmp_path / "a.json")
    assert [r for _, r in readers.iter_records(path)] == rows
    path.write_text(json.dumps(rows)[:-40])
    with pytest.raises(readers.SourceError, match="row 3[0-9]"):
        list(readers.iter_records(path))


def test_validate_parquet_finds_problems(tmp_path: Path) -> None:
    good = {
        "data_source": "x",
        "prompt": [{"role": "user", "content": "q"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "1"},
        "extra_info": {"split": "train", "index": 0, "source_row": 1},
    }
    bad = {**good, "reward_model": {"style": "model", "ground_truth": ""}}
    pq.write_table(pa.Table.from_pylist([good, bad], schema=SCHEMA), tmp_path / "t.parquet")
    assert validate_parquet(tmp_path / "t.parquet") == [
        f"{tmp_path / 't.parquet'}: row 2: field 'reward_model' needs style 'rule' and a non-empty ground_truth"
    ]
    pq.write_table(pa.Table.from_pylist([{"prompt": "q"}]), tmp_path / "u.parquet")
    assert any("'data_source' is missing" in e for e in validate_parquet(tmp_path / "u.parquet"))


def test_cli_convert_error_and_show_prompt(
    tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = syn.write_json([{"problem": "p"}], tmp_path / "s.json")
    assert exit_status(main, ["convert", str(src), str(tmp_path / "o"), "--quiet"]) == 2
    assert "row 1: field 'answer': missing" in capsys.readouterr().err
    assert (
        main(
            ["show-prompt", "--tokenizer", str(tokenizer_dir), "--problem", "What is 1+1?", "--style", "user"]
        )
        == 0
    )
    out = capsys.readouterr()
    assert out.out.startswith("<|im_start|>user\n" + R1_ZERO_INSTRUCTION)
    assert out.out.rstrip().endswith("<|im_start|>assistant") and "tokens" in out.err
