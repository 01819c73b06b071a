"""The planner's trainer modes (tools/plan/modes.py): each mode side by side, the memory model's
verdict on a separate_async split, and the model's error on published sync/async pairs."""

from __future__ import annotations

import pytest

from tools import plan as P
from tools.plan import modes


@pytest.fixture(scope="module")
def flagship():
    return P.plan("deepseek-v3-671b-a3", [], check_machine=False, stack="current")


def test_every_mode_side_by_side(flagship):
    by = {m.mode: m for m in flagship.modes}
    assert set(by) == {"sync", "colocate_async", "separate_async"}
    assert by["sync"].step_s == pytest.approx(flagship.step_s)
    # the tail cut only shortens generation; nothing else changes in colocate_async
    assert by["sync"].step_s * 0.5 < by["colocate_async"].step_s < by["sync"].step_s
    text = "\n".join(flagship.mode_lines)
    assert "colocate_async" in text and "separate_async" in text and "best:" in text
    # tokens/s per device counts every device of the pool in each mode
    for m in flagship.modes:
        assert m.tokens_per_s_per_device == pytest.approx(
            by["sync"].tokens_per_s_per_device * by["sync"].step_s / m.step_s
        )


def test_a_split_carries_the_memory_verdict(flagship):
    seps = [m for m in flagship.modes if m.mode == "separate_async"]
    assert seps and all(m.fits is not None for m in seps)
    assert any(m.fits for m in seps), "the memory model found no trainer share that fits"
    # the best mode never is a split that does not fit
    assert modes.best(flagship.modes).fits is not False


def test_weight_sync_over_the_link(flagship):
    st = P.timeplan.plan_time(P.R.compose("deepseek-v3-671b-a3", [], stack="current")).step
    # 671B bf16 (1.34 TB) at 0.21 of a 25 GB/s die link: minutes, the reason separate_async loses here
    assert 150 < modes.sync_seconds(st) < 400


def test_tail_factor_follows_the_lengths():
    st = P.timeplan.plan_time(P.R.compose("deepseek-v3-671b-a3", [], stack="current")).step
    short = P.timeplan.plan_time(
        P.R.compose("deepseek-v3-671b-a3", ["launch.expect.response_tokens=1900"], stack="current")
    ).step
    assert 0 < modes.tail_factor(st) < modes.tail_factor(short) <= 1.0


def test_a_model_error_only_from_pairs_whose_every_input_is_published(flagship, monkeypatch):
    """`make plan` states an error of the model only for a pair with no assumed input; a pair with one is
    printed as an illustration with its assumptions (both shipped pairs have some: generation share, tail,
    the sync baseline's layout)."""
    assert all(p.assumed_inputs for p in modes.PUBLISHED)
    text = "\n".join(modes.lines(flagship.modes))
    assert "error of the predicted speedup" not in text and "illustrations, not a model error" in text
    assert "generation 65% of the sync step" in text
    assert all("error +" not in line and "error -" not in line for line in modes.published_lines())
    measured = modes.PublishedPair("all published", "x", "colocate_async", 100.0, 80.0, 40.0, 60.0, 0.5, 0.0,
                                   None, False, "")  # fmt: skip
    monkeypatch.setattr(modes, "PUBLISHED", [measured, *modes.PUBLISHED])
    text = "\n".join(modes.lines(flagship.modes))
    assert f"published pairs (every input published): {measured.error():+.0%} " in text
    assert f"error {measured.error():+.0%}." in modes.published_lines()[1]
