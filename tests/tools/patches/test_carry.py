"""Carrying a series to another stack (`make rebase-upstream FROM=<stack>`) and accounting for every
patch of the other stack (patches/<stack>/carried.toml, the table in docs/patches.md)."""

from __future__ import annotations

import pytest

from tests.tools.patches.gitfixtures import add_stack, project_with_patch, sh
from tools.errors import UserError
from tools.patches import carry, git, rebase, table
from tools.patches.config import load_upstreams
from tools.patches.series import load_series, read_series


def two_stacks(tmp_path):
    """alpha: v1 + two patches (hello 'hi', util Y=20); beta: v2, which already has util's Y=20."""
    p = project_with_patch(tmp_path)
    (p.origin / "util.py").write_text("X = 1\nY = 20\nZ = 3\n")
    (p.origin / "hello.py").write_text(
        "# v2\ndef greet():\n    return 'hello'\n\n\ndef other():\n    return 1\n"
    )
    sh(p.origin, "commit", "-qam", "v2")
    sh(p.origin, "tag", "v2")
    beta = add_stack(p, "beta", "v2", sh(p.origin, "rev-parse", "HEAD"))
    return p, p.upstream(), beta


def per_stack(p):
    return {s: list(load_upstreams(p.root, s).values()) for s in ("alpha", "beta")}


def test_carry_ports_with_a_trailer_and_reports_what_upstream_has(tmp_path):
    p, alpha, beta = two_stacks(tmp_path)
    out = rebase.carry(beta, alpha)
    assert "carried 1 of 2 patches from alpha/demo" in out
    assert "already upstream (empty here): demo-util-raise-Y.patch" in out
    (patch,) = load_series(beta)
    assert patch.trailers["Ported-From"] == ["alpha/demo/demo-core-change-greeting.patch"]
    assert (
        "return 'hi'" in (beta.tree / "hello.py").read_text()
        and "# v2" in (beta.tree / "hello.py").read_text()
    )
    # carrying again ports nothing twice (the absorbed one is tried again, and is empty again)
    assert "carried 0 of 1 patches" in rebase.carry(beta, alpha) and len(read_series(beta)) == 1
    # the absorbed patch must be accounted for, then the table says what became of each
    problems = carry.lint("beta", per_stack(p), p.root)
    assert problems == []  # no carried.toml: beta does not claim to account for alpha
    (p.root / "patches/beta/carried.toml").write_text('from = "alpha"\n')
    problems = carry.lint("beta", per_stack(p), p.root)
    assert any("alpha/demo/demo-util-raise-Y.patch is not accounted for" in x for x in problems)
    (p.root / "patches/beta/carried.toml").write_text(
        'from = "alpha"\n["demo/demo-util-raise-Y.patch"]\nstatus = "absorbed"\nby = "v2"\n'
        'where = "util.py"\nno-test = "demo"\n'
    )
    assert carry.lint("beta", per_stack(p), p.root) == []
    assert "carried 0 of 0 patches" in rebase.carry(beta, alpha)  # accounted for: not tried again
    rows = "\n".join(table.render(per_stack(p), p.root).splitlines())
    assert "| ported: [demo/demo-core-change-greeting.patch]" in rows and "| absorbed | v2; util.py |" in rows


def test_carry_stops_at_a_conflict_and_records_a_dropped_patch(tmp_path):
    p, alpha, beta = two_stacks(tmp_path)
    (beta.tree / "hello.py").write_text("def greet():\n    return 'hey'\n\n\ndef other():\n    return 1\n")
    sh(beta.tree, "commit", "-qam", "demo: core: say hey\n\nWhy.\n\nUpstream-Status: Pending\nPatch-Type: bugfix\n"
       "Remove-When: never\nTested-By: tests/test_demo.py\n")  # fmt: skip
    from tools.patches import manager

    manager.export(beta)
    with pytest.raises(UserError) as e:
        rebase.carry(beta, alpha)
    assert "demo-core-change-greeting.patch conflicts with beta/demo at v2" in str(e.value)
    assert "rebase --stack beta --continue demo" in str(e.value)
    git.git(beta.tree, "am", "--skip")
    out = rebase.resume(beta)
    assert "dropped by hand (am --skip): demo-core-change-greeting.patch" in out
    assert read_series(beta) == ["demo-core-say-hey.patch"]


def test_bad_carried_entries_are_named(tmp_path):
    p, alpha, beta = two_stacks(tmp_path)
    (p.root / "patches/beta/carried.toml").write_text(
        'from = "alpha"\n'
        '["demo/demo-util-raise-Y.patch"]\nstatus = "absorbed"\nby = "v2"\n'
        '["demo/demo-core-change-greeting.patch"]\nstatus = "gone"\n'
        '["demo/nothing.patch"]\nstatus = "not-needed"\nwhy = "x"\nno-test = "x"\n'
    )
    problems = carry.lint("beta", per_stack(p), p.root)
    text = "\n".join(problems)
    assert "status absorbed needs where, test (or no-test)" in text
    assert "status 'gone' is not one of ported (a trailer), absorbed, not-needed, pending" in text
    assert '["demo/nothing.patch"]: no such patch in patches/alpha/*/series' in text


def test_a_patch_carried_by_two_links_each(monkeypatch):
    """One patch of the source stack split in two on this one: the table links both, each to its file."""
    two = carry.Outcome("demo/old.patch", "demo: old", "ported", "", None, by="demo/a.patch, demo/b.patch")
    monkeypatch.setattr(carry, "outcomes", lambda *a, **k: ("alpha", [two], []))
    (row,) = [line for line in carry.render("beta", {}) if "old.patch" in line]
    assert (
        "ported: [demo/a.patch](../patches/beta/demo/a.patch), [demo/b.patch](../patches/beta/demo/b.patch)"
        in row
    )
