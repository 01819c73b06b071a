"""Open a user's parquet file: an empty, truncated or garbage file is one line naming it and what is wrong.

pyarrow says only `ArrowInvalid: Parquet magic bytes not found in footer. Either the file is corrupted or
this is not a parquet file`; `open_parquet` tells the cases apart from the file's own bytes (a parquet file
starts and ends with the magic bytes PAR1) and names the file and the fix. Every reader of a user's parquet
goes through it: `make data`, `make check-data`, `make plan` and `make train`'s data rules.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tools.errors import UserError

MAGIC = b"PAR1"


class ParquetError(UserError):
    """A parquet file that cannot be read: the message names it and says what is wrong."""


def what_is_wrong(path: Path, error: Exception | None = None) -> str:
    """A short description of why `path` is not a readable parquet file, from its bytes."""
    size = path.stat().st_size
    if size == 0:
        return "empty (0 bytes)"
    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(max(0, size - 4))
        tail = f.read(4)
    if head != MAGIC:
        return f"not a parquet file ({size} bytes that do not start with the parquet magic bytes PAR1)"
    if tail != MAGIC or size < 12:
        return f"truncated ({size} bytes: it starts as a parquet file but its footer is missing)"
    return f"damaged ({size} bytes; pyarrow: {str(error).splitlines()[0] if error else 'unreadable'})"


def open_parquet(path: str | Path, fix: str | None = None) -> pq.ParquetFile:
    """pq.ParquetFile(path), or a ParquetError naming the file, what is wrong and `fix`."""
    path = Path(path)
    if not path.is_file():
        raise ParquetError(f"{path}: no such file", fix=fix)
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise ParquetError(f"{path}: {what_is_wrong(path, e)}", fix=fix) from None


def readable(path: str | Path) -> bool:
    """Whether open_parquet(path) succeeds."""
    try:
        open_parquet(path)
    except ParquetError:
        return False
    return True


def iter_batches(path: str | Path, fix: str | None = None, **kw: Any) -> Iterator[pa.RecordBatch]:
    """open_parquet(path).iter_batches(**kw), with damage found inside the file (a bad page) named too."""
    f = open_parquet(path, fix)
    try:
        yield from f.iter_batches(**kw)
    except (pa.ArrowException, OSError) as e:
        raise ParquetError(f"{path}: {what_is_wrong(Path(path), e)}", fix=fix) from None


def data_fix(path: str, key: str, made_dir: str | None, maker: str | None, raw: str | None = None) -> str:
    """The fix for a data file a recipe names that is missing or damaged: `maker` (the recipe's own
    tooling: "run `make prepare ...`") where that tooling writes it (launch.paths.data), else `make data`
    into its folder or the recipe's key pointed elsewhere."""
    p = Path(path)
    if maker and made_dir and p.parent == Path(made_dir):
        return maker + (f" (converts {raw})" if raw else "")
    return (
        f"convert your dataset into it: make data SRC=<your .json, .jsonl or .parquet> DST={p.parent} "
        f"(writes train.parquet and test.parquet), or point {key} at an existing parquet file"
    )
