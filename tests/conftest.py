"""Shared fixtures. Tests of a patch run against the applied tree under third_party/ (`make bootstrap`)."""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _trees_under_test_first() -> None:
    """`ASCEND_R1_TREE_<NAME>` (set by `make verify-patch-tests` for a scratch tree built without one
    patch) goes first on sys.path and PYTHONPATH, so that every `import verl` (or megatron, vllm), here and
    in the processes tests start, takes that tree rather than the editable install of third_party/."""
    for key, value in sorted(os.environ.items()):
        if key.startswith("ASCEND_R1_TREE_") and value:
            sys.path.insert(0, value)
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [value, os.environ.get("PYTHONPATH")]))


_trees_under_test_first()


def upstream_tree(name: str) -> Path:
    """Path of the (patched) working tree of upstream `name`, as `make bootstrap` leaves it.

    `ASCEND_R1_TREE_<NAME>` (upper case, '-' -> '_') points elsewhere, e.g. at a scratch tree.
    Fails (not skips) when the tree is absent: a patch whose test cannot run is not tested.
    """
    override = os.environ.get(f"ASCEND_R1_TREE_{name.upper().replace('-', '_')}")
    if override:
        return Path(override)
    with open(REPO / "patches" / "upstreams.toml", "rb") as f:
        path = REPO / tomllib.load(f)[name]["path"]
    if not (path / ".git").exists():
        pytest.fail(f"{path} has no source tree: run `make bootstrap` (or `make apply-patches UP={name}`)")
    return path


@pytest.fixture
def repo_root() -> Path:
    return REPO
