"""Stream records from JSON arrays, JSON Lines and parquet without loading the whole file.

Each reader yields (row_number, record) with 1-based row numbers: the element index in a JSON array,
the line number in JSON Lines, the row index + 1 in parquet. Structural errors name the file and row.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tools.errors import UserError

CHUNK = 1 << 20
_BLANK = " \t\r\n\ufeff"


class SourceError(UserError):
    """A file that cannot be read as the format it claims to be."""


class BadRecord(str):
    """A line of JSON Lines that is not valid JSON: a malformed row (skippable), not a broken file.
    (Inside a JSON array there is no way to resynchronise, so there it is a SourceError.)"""


def _json_array(path: Path) -> Iterator[tuple[int, Any]]:
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf, pos, eof = "", 0, False

        def fill() -> bool:
            """Append the next chunk (dropping what was consumed); False at end of file."""
            nonlocal buf, pos, eof
            if eof:
                return False
            more = f.read(CHUNK)
            if not more:
                eof = True
                return False
            buf, pos = buf[pos:] + more, 0
            return True

        def peek() -> str:
            """The next non-blank character ("" at end of file)."""
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in _BLANK:
                    pos += 1
                if pos < len(buf):
                    return buf[pos]
                if not fill():
                    return ""

        if peek() != "[":
            raise SourceError(
                f"{path}: expected a JSON array ('[' first); for one object per line use .jsonl"
            )
        pos += 1
        if peek() == "]":
            return
        row = 0
        while True:
            if peek() == "":
                raise SourceError(
                    f"{path}: row {row + 1}: the file ends inside the array; it may be truncated"
                )
            while True:
                try:
                    value, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError as e:
                    if fill():  # the element may run past the chunk
                        continue
                    raise SourceError(f"{path}: row {row + 1}: invalid JSON ({e.msg})") from e
                if end < len(buf) or not fill():  # a number touching the chunk end may go on
                    break
            row += 1
            yield row, value
            pos = end
            c = peek()
            if c == ",":
                pos += 1
            elif c == "]":
                return
            else:
                found = repr(c) if c else "end of file"
                raise SourceError(f"{path}: after row {row}: expected ',' or ']', found {found}")


def _jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as e:
                yield line_no, BadRecord(f"invalid JSON ({e.msg} at column {e.colno})")


def _parquet(path: Path) -> Iterator[tuple[int, Any]]:
    from tools.data.parquet import ParquetError, iter_batches  # loads pyarrow: only for parquet input

    row = 0
    fix = "write the parquet file again (pyarrow, pandas' to_parquet), or convert from the original .json/.jsonl"
    try:
        for batch in iter_batches(path, fix, batch_size=4096):
            for record in batch.to_pylist():
                row += 1
                yield row, record
    except ParquetError as e:
        raise SourceError(e.args[0], fix=e.fix) from None


def _sniff_json(path: Path) -> str:
    with open(path, encoding="utf-8") as f:
        head = f.read(4096).lstrip("\ufeff \t\r\n")
    return "array" if head.startswith("[") else "jsonl"


def iter_records(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(row_number, record) for every record of a .json (array or lines), .jsonl or .parquet file."""
    path = Path(path)
    if not path.is_file():
        raise SourceError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _parquet(path)
    if suffix in (".jsonl", ".ndjson"):
        return _jsonl(path)
    if suffix == ".json":
        return _json_array(path) if _sniff_json(path) == "array" else _jsonl(path)
    raise SourceError(f"{path}: unknown file type {suffix!r}; expected .json, .jsonl or .parquet")
