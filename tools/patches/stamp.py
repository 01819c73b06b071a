"""The manager's record inside each tree's git folder: where the sources came from, what was applied."""

from __future__ import annotations

import json
from pathlib import Path

from tools import atomic
from tools.patches import git as g

NAME = "ascend-r1.json"


def _path(tree: Path) -> Path:
    return g.gitdir(tree) / NAME


def read(tree: Path) -> dict:
    if not g.is_repo(tree):
        return {}
    try:
        return json.loads(_path(tree).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def write(tree: Path, values: dict, *, replace: bool = False) -> dict:
    """Merge `values` into the stamp (or replace it) atomically."""
    data = {} if replace else read(tree)
    data.update(values)
    data = {k: v for k, v in data.items() if v is not None}
    atomic.write_json(_path(tree), data)
    return data
