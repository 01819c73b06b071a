"""The real series against the real pinned sources (fetched by `make bootstrap`)."""

from __future__ import annotations

import pytest

from tests.conftest import upstream_tree
from tools import stacks
from tools.patches import sources, table
from tools.patches.check import check_one
from tools.patches.config import load_upstreams
from tools.patches.series import lint, read_series

STACK = stacks.resolve().name  # this session's stack: its trees are the ones bootstrapped here
UPSTREAMS = load_upstreams(stack=STACK)
WITH_PATCHES = [n for n, u in UPSTREAMS.items() if read_series(u)]
EVERY = {s: list(load_upstreams(stack=s).values()) for s in stacks.load()}


@pytest.mark.every_stack
@pytest.mark.parametrize("name", WITH_PATCHES)
def test_series_applies_strictly_with_matching_blobs_and_reexports_identically(name):
    up = UPSTREAMS[name]
    upstream_tree(name)  # fails with instructions when the tree is missing
    assert sources.pristine_ok(up), f"{up.tree} is not the pristine pin {up.version}: run make bootstrap"
    problems, diff = check_one(up, {n: read_series(u) for n, u in UPSTREAMS.items()})
    assert problems == [], "\n".join(problems) + "\n" + diff


def test_every_series_of_every_stack_lints_clean_and_the_table_is_fresh():
    problems = []
    for ups in EVERY.values():
        all_series = {u.name: read_series(u) for u in ups}
        problems += [p for u in ups for p in lint(u, all_series)]
    assert problems == []
    assert table.is_fresh(EVERY), "run `python3 -m tools.patches table`"


def test_there_is_a_real_series_to_check():
    assert any(
        read_series(u) for ups in EVERY.values() for u in ups
    ), "no patches: the checks would pass vacuously"
