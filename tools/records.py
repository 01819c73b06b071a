"""Reading the JSON and JSONL files a run writes while it runs (metrics, tallies, activity samples,
validation generations): a line that is not JSON, the torn last line of a file being written or a line
cut by a stop, is skipped, never an error; a file that is missing or unreadable reads as nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when it is missing or not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_jsonl(path: Path, keep: Callable[[Any], bool] = lambda rec: isinstance(rec, dict)) -> list[Any]:
    """The records of a JSONL file that `keep` accepts (by default: every JSON object); a line that is not
    JSON is skipped (a torn last line: a live run is writing it)."""
    out = []
    for line in Path(path).read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if keep(rec):
            out.append(rec)
    return out
