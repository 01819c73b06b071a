"""Convert a math dataset to verl's RL parquet: read (streaming), map, validate, de-duplicate, filter by
prompt length, shuffle and split with a seed, then write train/test parquet and a data card atomically.

Nothing appears at the destination until everything is written: files go to a temporary folder beside
it and are moved in at the end.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from tools.data.card import length_histogram, render_card
from tools.data.formats import FORMATS, Problem, RowError, generic
from tools.data.readers import BadRecord, SourceError, iter_records
from tools.data.schema import SCHEMA
from tools.data.template import TEMPLATES, build_prompt, instruction
from tools.data.tokenizer import load_tokenizer
from tools.errors import UserError

OUTPUT_FILES = ("train.parquet", "test.parquet", "data_card.md", "lengths.png")


class ConvertError(UserError):
    """A user-facing error: names the file, row and field, and what to do."""


@dataclass
class Options:
    src: Path
    dst: Path
    fmt: str = "deepscaler"
    data_source: str | None = None
    problem_field: str | None = None
    answer_field: str | None = None
    answer_from_boxed: bool = False
    style: str = "system"
    template: str = "r1-zero"  # tools/data/template.py TEMPLATES
    seed: int = 0
    test_size: float = 0.0  # < 1: fraction of rows; >= 1: number of rows
    dedupe: bool = True
    skip_bad: bool = False
    tokenizer: str | None = None
    max_prompt_length: int | None = None
    overwrite: bool = False
    progress: bool = True


@dataclass
class Result:
    counts: dict[str, int] = field(default_factory=dict)
    skipped: Counter[str] = field(default_factory=Counter)
    files: list[Path] = field(default_factory=list)


def _mapper(opts: Options) -> tuple[Callable[[Any], Problem], str]:
    if opts.fmt == "generic":
        if not opts.problem_field or not opts.answer_field:
            raise ConvertError(
                "--format generic needs --problem-field and --answer-field (dotted paths, e.g. turns.0.text)"
            )
        return generic(opts.problem_field, opts.answer_field, opts.answer_from_boxed), opts.src.stem
    if opts.fmt not in FORMATS:
        raise ConvertError(f"unknown --format {opts.fmt!r}; one of: {', '.join([*FORMATS, 'generic'])}")
    return FORMATS[opts.fmt]


def _dedupe_key(problem: str) -> bytes:
    return hashlib.blake2b(" ".join(problem.split()).casefold().encode(), digest_size=16).digest()


def _prompt_lengths(prompts: list[list[dict[str, str]]], tokenizer_path: str) -> list[int]:
    """Token count of each prompt rendered with the chat template and the generation prompt, as verl does."""
    tok = load_tokenizer(tokenizer_path)
    if not tok.chat_template:
        raise ConvertError(
            f"--tokenizer {tokenizer_path}: the tokenizer has no chat template; verl renders prompts with it"
        )
    lengths: list[int] = []
    step = 1024
    for i in range(0, len(prompts), step):
        texts = [
            tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
            for p in prompts[i : i + step]
        ]
        lengths += [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]
    return lengths


def _split_sizes(n: int, test_size: float) -> int:
    if test_size < 0:
        raise ConvertError(f"--test-size {test_size}: must be >= 0")
    n_test = int(round(n * test_size)) if test_size < 1 else int(test_size)
    if n_test > n:
        raise ConvertError(f"--test-size {test_size}: asks for {n_test} test rows but only {n} rows are left")
    return n_test


def _rows(
    problems: list[tuple[int, Problem]], prompts: list, order: list[int], split: str, source: str
) -> list[dict]:
    return [
        {
            "data_source": source,
            "prompt": prompts[k],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": problems[k][1].answer},
            "extra_info": {"split": split, "index": i, "source_row": problems[k][0]},
        }
        for i, k in enumerate(order)
    ]


def _check_destination(dst: Path, overwrite: bool) -> None:
    if dst.exists() and not dst.is_dir():
        raise ConvertError(f"{dst}: exists and is not a folder; pick another destination")
    if dst.is_dir():
        ours = [dst / f for f in OUTPUT_FILES if (dst / f).exists()]
        others = [p for p in dst.iterdir() if p not in ours]
        if ours and not overwrite:
            raise ConvertError(f"{dst}: already holds a converted dataset; pass --overwrite to replace it")
        if others and not ours:
            raise ConvertError(f"{dst}: is a folder with other files; pick an empty or new folder")


def convert(opts: Options) -> Result:
    mapper, default_source = _mapper(opts)
    if opts.template not in TEMPLATES:
        raise ConvertError(
            f"--template {opts.template!r}: one of {', '.join(TEMPLATES)} (tools/data/template.py)"
        )
    source = opts.data_source or default_source
    _check_destination(opts.dst, opts.overwrite)
    res = Result()

    # 1. read and map, streaming
    problems: list[tuple[int, Problem]] = []
    read = 0
    seen: dict[bytes, str] = {}
    duplicates = conflicts = 0
    try:
        records = iter_records(opts.src)
        for row, record in tqdm(
            records, desc=f"reading {opts.src.name}", unit=" rows", disable=not opts.progress
        ):
            read += 1
            try:
                if isinstance(record, BadRecord):
                    raise RowError("(line)", str(record))
                p = mapper(record)
            except RowError as e:
                if not opts.skip_bad:
                    raise ConvertError(
                        f"{opts.src}: row {row}: {e}. Fix the row, or pass --skip-bad to skip malformed rows "
                        "(they are counted in the data card)"
                    ) from None
                res.skipped[f"{e.field}: {e.message}"] += 1
                continue
            if opts.dedupe:
                key = _dedupe_key(p.problem)
                if key in seen:
                    duplicates += 1
                    conflicts += seen[key] != p.answer
                    continue
                seen[key] = p.answer
            problems.append((row, p))
    except SourceError as e:
        raise ConvertError(e.args[0], fix=e.fix) from None
    res.counts["read"] = read
    res.counts["skipped (malformed)"] = sum(res.skipped.values())
    res.counts["duplicates dropped"] = duplicates
    if conflicts:
        res.counts["... of which with a different answer (first kept)"] = conflicts

    # 2. prompts and the optional length filter
    text = instruction(opts.template)
    prompts = [build_prompt(p.problem, opts.style, text) for _, p in problems]
    if opts.tokenizer:
        lengths, unit = _prompt_lengths(prompts, opts.tokenizer), "tokens"
    else:
        lengths, unit = [sum(len(m["content"]) for m in pr) for pr in prompts], "characters"
    keep = list(range(len(problems)))
    if opts.max_prompt_length is not None:
        if not opts.tokenizer:
            raise ConvertError("--max-prompt-length needs --tokenizer (lengths are counted in tokens)")
        keep = [i for i in keep if lengths[i] <= opts.max_prompt_length]
        res.counts[f"too long (> {opts.max_prompt_length} tokens)"] = len(problems) - len(keep)
    if not keep:
        raise ConvertError(f"{opts.src}: no rows left to write (see the counts: {res.counts})")

    # 3. seeded shuffle and split
    random.Random(opts.seed).shuffle(keep)
    n_test = _split_sizes(len(keep), opts.test_size)
    test, train = keep[:n_test], keep[n_test:]
    res.counts["train"], res.counts["test"] = len(train), len(test)

    # 4. write everything into a temporary folder, then move it in
    opts.dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{opts.dst.name}.partial-", dir=opts.dst.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the published folder should not be
    try:
        for name, order in (("train", train), ("test", test)):
            if order:
                table = pa.Table.from_pylist(_rows(problems, prompts, order, name, source), schema=SCHEMA)
                pq.write_table(table, tmp / f"{name}.parquet")
        kept_lengths = [lengths[i] for i in keep]
        length_histogram(kept_lengths, unit, tmp / "lengths.png")
        first = train[0] if train else test[0]
        card = render_card(
            title=f"{opts.dst.name}: {source}",
            source=str(opts.src),
            fmt=opts.fmt,
            data_source=source,
            style=opts.style,
            template=opts.template,
            seed=opts.seed,
            counts=res.counts,
            skipped=res.skipped,
            lengths=kept_lengths,
            unit=unit,
            example=prompts[first],
            example_answer=problems[first][1].answer,
        )
        (tmp / "data_card.md").write_text(card + "\n", encoding="utf-8")
        res.files = _publish(tmp, opts.dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def _publish(tmp: Path, dst: Path) -> list[Path]:
    """Move the finished files in: the whole folder at once when dst is new, else file by file."""
    if not dst.exists():
        os.rename(tmp, dst)
        return sorted(dst.iterdir())
    for stale in OUTPUT_FILES:  # a previous conversion's file this one does not write (e.g. test.parquet)
        if (dst / stale).exists() and not (tmp / stale).exists():
            (dst / stale).unlink()
    for f in sorted(tmp.iterdir()):
        os.replace(f, dst / f.name)
    return sorted(dst / f for f in OUTPUT_FILES if (dst / f).exists())


def print_summary(res: Result, out: Any = sys.stdout) -> None:
    width = max(len(k) for k in res.counts)
    for k, v in res.counts.items():
        print(f"  {k:<{width}}  {v}", file=out)
    for reason, n in res.skipped.most_common():
        print(f"  skipped {n} x {reason}", file=out)
    for f in res.files:
        print(f"  wrote {f}", file=out)
