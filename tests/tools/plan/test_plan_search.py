"""The layout search: on the A2 recipe (8 ranks) it returns at most five layouts, fastest first, each one
the memory model says fits and none slower than a layout it skipped would be; the recipe's own layout is
timed through the same path, and a layout change is reported against it."""

from __future__ import annotations

import pytest

from tools.plan import factors as F
from tools.plan import runsetup as RS
from tools.plan import search as S
from tools.plan import timing as T
from tools.recipes.recipe import compose


@pytest.fixture(scope="module")
def searched():
    cfg = compose("qwen2.5-7b-a2", stack="published")
    base = RS.setup_of(cfg)
    return cfg, base, S.search(cfg, base, F.shipped())


def test_top_layouts_fit_and_come_fastest_first(searched):
    cfg, base, res = searched
    assert 0 < len(res.top) <= S.TOP
    assert [c.step_s for c in res.top] == sorted(c.step_s for c in res.top)
    for c in res.top:
        ok, peak, _ = S.memory_fits(cfg, base.with_(actor=c.actor, rollout=c.rollout))
        assert ok and peak <= 1.0
        assert c.dominant in T.PHASES


def test_no_fitting_layout_is_faster_than_the_fifth(searched):
    """Exhaustive check on a sample: any enumerated pair that fits is not faster than the slowest listed
    one (the search may only stop early when that holds)."""
    cfg, base, res = searched
    f = F.shipped()
    worst = res.top[-1].step_s
    for a in S.actors(base, npu=True)[::97]:
        for r in S.rollouts(base)[::3]:
            s = base.with_(actor=a, rollout=r)
            ok, _, est = S.memory_fits(cfg, s)
            if not ok:
                continue
            from dataclasses import replace

            s = s.with_(rollout=replace(r, kv_capacity_seqs=S.kv_seqs(s, est)))
            assert T.step(s, f).step_s >= worst - 1e-6 or (a.tp, a.pp, a.ep, a.etp, r.tp, r.ep) in {
                (c.actor.tp, c.actor.pp, c.actor.ep, c.actor.etp, c.rollout.tp, c.rollout.ep) for c in res.top
            }


def test_report_lines_name_the_changes(searched):
    _, base, res = searched
    text = "\n".join(res.lines(base))
    assert "recipe's layout" in text and "change from the recipe" in text
    assert S.changes(base, S.Candidate(base.actor, base.rollout, 1.0, {}, "update", 0.5)) == ""
