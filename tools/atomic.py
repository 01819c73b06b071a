"""Atomic file writes for every tool: write to a temporary name in the same directory, fsync, then rename.

Standard library only: the patch manager and bootstrap use it before the virtual environment exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TMP_SUFFIX = ".partial"


def tmp_path_for(path: Path) -> Path:
    return path.with_name(path.name + TMP_SUFFIX)


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path; on success fsync it and rename it to `path`, on failure remove it."""
    path = Path(path)
    tmp = tmp_path_for(path)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_bytes(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_json(path: Path, obj: Any) -> None:
    write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def copy_file(src: Path, dst: Path) -> None:
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)


def commit(tmp: Path, path: Path) -> None:
    """fsync a finished temporary file and rename it into place (the second half of atomic_path)."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
