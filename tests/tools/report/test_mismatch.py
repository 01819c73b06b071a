"""The report's rollout-vs-actor mismatch line (tools/report/mismatch.py): which of a weight hand-over fault,
routing and precision it is, and the steps whose worst token passes `launch.health.mismatch_bound`; on the
page (the bound and the flagged steps on the plot, the line under it) and at the end of `make train`.
On a recorded tiny-cpu run (verl 0.9.1, 6 steps) whose mismatch metrics are set per case."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tools import report as RP
from tools.report import health
from tools.report import mismatch as MM
from tools.report import page as P
from tools.report import runs as RR
from tools.report import terminal as TM

TINY = Path(__file__).parent / "data" / "run-tiny-cpu"


@pytest.fixture
def run(tmp_path) -> RR.Run:
    shutil.copytree(TINY, tmp_path / "run")
    return RR.read(tmp_path / "run")


def set_metrics(r: RR.Run, key: str, values: dict[int, float]) -> None:
    for step, v in values.items():
        r.steps[step][key] = v


def quiet(r: RR.Run) -> None:
    """Every step healthy: a mean far below the hand-over tolerance, a worst token below the bound."""
    set_metrics(r, MM.MEAN, {s: 1e-4 for s in r.steps})
    set_metrics(r, MM.MAX, {s: 0.02 for s in r.steps})


def test_the_recorded_run_is_within_the_bound_and_says_nothing_at_the_end(run):
    v = MM.verdict(run)
    assert v.cause == "within the bound" and not v.flagged and not v.worth_saying
    assert v.bound == 0.1  # recipes/algorithm/grpo-r1-zero.yaml's default, read from the run's config.yaml
    worst = max(run.steps, key=lambda s: run.steps[s][MM.MAX])
    assert v.line.endswith(f"the largest {run.steps[worst][MM.MAX]:.3g} at step {worst}")
    assert not any("mismatch" in line for line in TM.end_lines(run))


def test_a_step_above_the_bound_is_flagged_and_without_routing_metrics_not_blamed(run):
    quiet(run)
    set_metrics(run, MM.MAX, {2: 0.35, 5: 0.92})
    v = MM.verdict(run)
    assert v.flagged == [2, 5] and v.cause == "routing or precision"  # tiny-cpu is an MoE model
    assert (
        "2 of 6 steps have a token above the bound 0.1" in v.line and "not a weight hand-over fault" in v.line
    )
    assert v.line in TM.end_lines(run)
    # the bound is the run's: raised above the worst token, nothing is flagged
    OmegaConf.update(run.config, "launch.health.mismatch_bound", 0.95)
    assert MM.verdict(run).flagged == [] and MM.verdict(run).cause == "within the bound"


def test_routing_or_precision_from_the_share_that_tokens_routed_differently_carry(run):
    quiet(run)
    set_metrics(run, MM.MAX, {3: 0.6})
    set_metrics(run, MM.DISAGREEMENT, {s: 0.01 for s in run.steps})
    set_metrics(run, MM.ROUTING_SHARE, {s: 0.9 for s in run.steps})
    routing = MM.verdict(run)
    assert routing.cause == "routing" and "carry 90% of the difference" in routing.line
    set_metrics(run, MM.ROUTING_SHARE, {3: 0.2})  # at the flagged step the same-route tokens carry it
    assert MM.verdict(run).cause == "precision"
    # both: most flagged steps precision's, the largest routing's (the miniature's picture)
    set_metrics(run, MM.MAX, {1: 0.2, 2: 0.15, 3: 0.9})
    set_metrics(run, MM.ROUTING_SHARE, {1: 0.0, 2: 0.1, 3: 0.8})
    both = MM.verdict(run)
    assert both.cause == "precision and routing" and both.flagged == [1, 2, 3]
    assert "most of it at 1 of them (steps 3), among them the largest (0.9 at step 3)" in both.line
    set_metrics(run, MM.ROUTING_SHARE, {1: 0.6, 3: 0.8})
    assert MM.verdict(run).cause == "routing"
    set_metrics(run, MM.MAX, {1: 0.11, 2: 0.15, 3: 0.12})
    set_metrics(run, MM.ROUTING_SHARE, {1: 0.0, 2: 0.7, 3: 0.1})
    assert "not the largest (0.15 at step 2)" not in MM.verdict(run).line  # step 2 is the largest: among them
    set_metrics(run, MM.ROUTING_SHARE, {1: 0.7, 2: 0.1, 3: 0.1})
    assert "not the largest (0.15 at step 2)" in MM.verdict(run).line
    set_metrics(run, MM.MAX, {1: 0.02, 2: 0.02, 3: 0.6})
    set_metrics(run, MM.ROUTING_SHARE, {s: 0.9 for s in run.steps})
    set_metrics(run, MM.ROUTING_SHARE, {3: 0.2})
    # a dense model routes nothing: precision, without routing metrics
    run.steps[3].pop(MM.ROUTING_SHARE)
    OmegaConf.update(run.config, "launch.model_config.n_routed_experts", 0)
    assert MM.verdict(run).cause == "precision" and "dense" in MM.verdict(run).line


def test_a_mismatch_on_every_token_is_called_a_hand_over_fault(run):
    quiet(run)
    # a stale hand-over: the engine samples from other weights, every token's probability moves
    set_metrics(run, MM.MEAN, {4: 0.03, 5: 0.04, 6: 0.05})
    set_metrics(run, MM.MAX, {4: 0.3, 5: 0.4, 6: 0.5})
    set_metrics(run, MM.ROUTING_SHARE, {s: 0.9 for s in run.steps})  # routing does not explain it away
    v = MM.verdict(run)
    assert v.cause == "hand-over fault" and v.worth_saying and v.flagged == [4, 5, 6]
    assert "at 3 of 6 steps (4, 5, 6; 0.05 at step 6)" in v.line
    # the boundary: the project's hand-over tolerance (tests/train_e2e.py HANDOVER_MEAN_TOL)
    set_metrics(run, MM.MEAN, {4: 0.0049, 5: 0.0049, 6: 0.0049})
    assert MM.verdict(run).cause == "routing"


def test_not_measured_where_the_rollout_returns_no_log_probs(run):
    for m in run.steps.values():
        m.pop(MM.MEAN, None)
        m.pop(MM.MAX, None)
    assert MM.verdict(run).cause == "not measured" and "calculate_log_probs" in MM.verdict(run).line


def test_the_page_draws_the_bound_and_says_the_line(run):
    quiet(run)
    set_metrics(run, MM.MAX, {5: 0.7})
    with open(run.folder / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    for row in rows:  # write the changed metrics back so that `make report` reads them
        if row.get("kind") == "train":
            row["metrics"].update({k: run.steps[row["step"]][k] for k in (MM.MEAN, MM.MAX)})
    (run.folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    RP.write(run.folder)
    page = (run.folder / "report" / "report.html").read_text()
    caption = page.split('id="fig-rollout_probs"', 1)[1].split("</figure>", 1)[0]
    assert "1 of 6 steps have a token above the bound 0.1 (launch.health.mismatch_bound): steps 5" in caption
    routing = page.split('id="absent-routing"', 1)[1].split("</div>", 1)[0]
    assert "launch.measure_routing was off" in routing  # the recorded run predates the measurement


def test_verls_sequence_level_figures_at_the_worst_step_are_said_where_logged(run):
    """rollout_corr/* (verl's off-policy metrics) at the step whose worst token is the largest, on the page
    under the mismatch plot; nothing where the run logged none of them."""
    quiet(run)
    set_metrics(run, MM.MAX, {4: 0.92})
    assert MM.sequence_line(run).startswith(
        "rollout_corr/* at step 4 (its worst token 0.92): log_ppl_diff_max "
    )
    set_metrics(run, "rollout_corr/log_ppl_diff_max", {4: 5.2, 5: 0.01})
    set_metrics(run, "rollout_corr/training_ppl", {4: 3.8})
    set_metrics(run, "rollout_corr/rollout_ppl", {4: 1.24})
    line = MM.sequence_line(run)
    assert "log_ppl_diff_max 5.2, training_ppl 3.8, rollout_ppl 1.24" in line
    assert line in health.notes(run, next(p for p in health.HEALTH if p.name == "rollout_probs.png"))
    for m in run.steps.values():
        for k in MM.CORR:
            m.pop(k, None)
    assert MM.sequence_line(run) is None


def test_the_hand_over_threshold_is_the_hand_over_checks_own():
    """The line's hand-over rule and the end-to-end tests' hand-over check (tests/train_e2e.py, applied at every
    step by tests/test_zero.py and tests/test_learn.py) hold the mean to the same tolerance: a run those tests
    fail is a run the report calls a hand-over fault."""
    from tests import train_e2e

    assert MM.HANDOVER_MEAN == train_e2e.HANDOVER_MEAN_TOL


def test_the_routing_panel_draws_what_the_run_measured(run):
    """A run with launch.measure_routing logs rollout/routing_disagreement and rollout/mismatch_routing_share
    (the verl patch): the page draws both on their own panel and cites them; the line says routing."""
    quiet(run)
    set_metrics(run, MM.MAX, {4: 0.6})
    set_metrics(run, MM.DISAGREEMENT, {s: 0.01 for s in run.steps})
    set_metrics(run, MM.ROUTING_SHARE, {s: 0.8 for s in run.steps})
    with open(run.folder / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    keys = (MM.MEAN, MM.MAX, MM.DISAGREEMENT, MM.ROUTING_SHARE)
    for row in rows:
        if row.get("kind") == "train":
            row["metrics"].update({k: run.steps[row["step"]][k] for k in keys})
    (run.folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    RP.write(run.folder)
    page = (run.folder / "report" / "report.html").read_text()
    assert (run.folder / "report" / "routing.png").stat().st_size > 5_000
    caption = page.split('id="fig-routing"', 1)[1].split("</figure>", 1)[0]
    assert f"<code>{MM.DISAGREEMENT}</code>" in caption and f"<code>{MM.ROUTING_SHARE}</code>" in caption
    v = MM.verdict(RR.read(run.folder))
    assert v.cause == "routing" and v.flagged == [4] and P.esc(v.line) in page


def test_a_run_that_replayed_the_routes_is_not_told_routing(run):
    """With R3 the actor scored every token with the rollout's experts: whatever share the tokens its own
    router would have sent elsewhere carry, the rest of the mismatch is kernels."""
    quiet(run)
    set_metrics(run, MM.MAX, {4: 0.6})
    set_metrics(run, MM.DISAGREEMENT, {s: 0.01 for s in run.steps})
    set_metrics(run, MM.ROUTING_SHARE, {s: 0.8 for s in run.steps})
    assert MM.verdict(run).cause == "routing"
    OmegaConf.update(
        run.config, "verl.actor_rollout_ref.actor.megatron.router_replay.mode", "R3", force_add=True
    )
    v = MM.verdict(run)
    assert v.cause == "precision" and "routing replay (R3)" in v.line and "80%" in v.line
