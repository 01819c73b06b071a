"""Reading what a run writes.

- The JSON and JSONL files it writes while it runs (metrics, tallies, activity samples, validation
  generations): a line that is not JSON, the torn last line of a file being written or a line cut by a
  stop, is skipped, never an error; a file that is missing or unreadable reads as nothing.
- verl's validation metric names, `val-core/<data source>/<metric>/mean@<n>` (and `val-aux/...`): the one
  parser the analyses and the report read them with.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple


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


_VALIDATION = re.compile(r"^val-(core|aux)/(.+)/([^/]+)/mean@(\d+)$")


class ValidationKey(NamedTuple):
    kind: str  # "core" (verl's headline metrics: acc) or "aux" (the reward's other parts: format, trace, ...)
    source: str  # the data source (a parquet row's data_source, e.g. addition, addition-3d)
    metric: str  # acc, format, timeout, trace, score, reward, ...
    n: int  # samples per problem the mean is over


def validation_key(key: str) -> ValidationKey | None:
    """verl's validation mean `val-<kind>/<source>/<metric>/mean@<n>` parsed; None for any other key
    (best@n, worst@n, std@n and the training metrics)."""
    m = _VALIDATION.match(key)
    return ValidationKey(m.group(1), m.group(2), m.group(3), int(m.group(4))) if m else None


def is_accuracy(key: str) -> bool:
    """verl's validation accuracy: val-core/<source>/acc/mean@<n>."""
    v = validation_key(key)
    return v is not None and v.kind == "core" and v.metric == "acc"
