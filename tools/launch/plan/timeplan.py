"""The planner's time section: predicted seconds per phase and a step, tokens/s per device (rank) and per
card, the expected lengths, the efficiency factors and the hardware figures it used, each with its source.

    make plan RECIPE=<r>              the A3 factors fitted on the seed run (A2/CPU: the same, said so)
    make plan RECIPE=<r> RUN=<run>    factors fitted on that run's measured phase times (timing_s/*)

JSON keys (an interface, docs/plan-time.md): time_s {phase: seconds}, step_s, tokens_per_s_per_device
(per NPU die = rank), tokens_per_s_per_card (per card: an A3 package of 2 dies).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tools.errors import UserError
from tools.launch.plan import calibrate as C
from tools.launch.plan import factors as F
from tools.launch.plan import runsetup as RS
from tools.launch.plan import search as S
from tools.launch.plan import timing as T
from tools.launch.plan import validation as V

LABEL = {
    "generate": "generate",
    "reshard": "reshard (weight sync)",
    "reward": "reward",
    "old_log_prob": "old log-prob",
    "ref": "reference",
    "update": "update",
    "other": "other",
}


@dataclass
class TimePlan:
    step: T.StepTime
    lengths_how: str
    factors_how: str
    search_lines: list[str] = field(default_factory=list)
    validation: V.ValidationCost | None = None  # one validation's cost (validation.py)

    def json(self) -> dict[str, Any]:
        return {
            "time_s": {k: round(v, 3) for k, v in self.step.seconds().items()},
            "step_s": round(self.step.step_s, 3),
            "tokens_per_s_per_device": round(self.step.tokens_per_s_per_device, 3),
            "tokens_per_s_per_card": round(self.step.tokens_per_s_per_card, 3),
            "accuracy": self.step.factors.accuracy,
            "validation": self.validation.json(self.step.step_s) if self.validation else None,
        }

    def lines(self) -> list[str]:
        st, s = self.step, self.step.setup
        g = s.group
        out = [f"expected lengths: {self.lengths_how}"]
        for name, ph in st.phases.items():
            if ph.seconds <= 0 and name == "ref":
                continue
            detail = "; ".join(
                f"{t.name} {t.seconds:.1f}" + (f" ({t.note})" if t.note else "")
                for t in ph.terms
                if t.seconds
            )
            out.append(f"{LABEL[name]:<22}{ph.seconds:>9.1f} s   {detail}")
        card = (
            f"{st.tokens_per_s_per_card:.1f} per card ({g.dies_per_device} dies)"
            if g.dies_per_device > 1
            else ""
        )
        out.append(
            f"{'step':<22}{st.step_s:>9.1f} s   tokens/s {st.tokens_per_s_per_device:.1f} per device (rank)"
            + (f", {card}" if card else "")
            + f"; dominant: {LABEL[st.dominant()]}"
        )
        if self.validation is not None:
            out += self.validation.lines(st.step_s)
        ln = s.lengths
        at_cap = ln.clip if ln.clip is not None else 1.0 if ln.capped else math.exp(-ln.response_max / ln.mu)
        reshard = (
            "each rollout rank receives its own shard"
            if s.rollout.reshard == "shard"
            else "verl gathers the whole model to every rank"
        )
        out.append(
            f"assumptions: responses {ln.law}, mean {ln.response:.0f}, cut at {ln.response_max} "
            f"({at_cap:.0%} reach it); a wave decodes until its longest response ends; old log-prob pass "
            f"{'on' if s.actor.old_log_prob else 'off'}; at reshard {reshard}; links at their peak, the "
            "fitted factor on each phase's main term (docs/plan-time.md)"
        )
        if st.factors.accuracy:
            out.append(f"stated accuracy: {st.factors.accuracy}")
        out.append(f"factors ({self.factors_how}):")
        out += [f"  {k} = {v}: {what}" for k, v, what in st.factors.described()]
        out.append(f"hardware: {g.key}, {g.world} ranks of {g.chip.name}:")
        out += [f"  {k} {fig.value:.4g}: {fig.source}" for k, fig in g.chip.figures().items()]
        return out


def run_setup(run: Path, cfg: DictConfig, measured: C.Measured) -> T.Setup:
    """The Setup the run had: its own composed config (config.yaml in a make train run folder), else the
    recipe's; the run's measured mean lengths."""
    folder = run if run.is_dir() else run.parent
    own = folder / "config.yaml"
    rcfg = OmegaConf.load(own) if own.is_file() else cfg
    cap = int(OmegaConf.select(rcfg, "verl.data.max_response_length"))
    response = min(measured.response, cap)
    lengths = T.Lengths.of(max(measured.prompt, 1.0), max(response, 1.0), cap)
    return RS.setup_of(rcfg, lengths)


def plan_time(cfg: DictConfig, run: Path | None = None, estimate=None) -> TimePlan:
    """The prediction for a composed recipe; `estimate` (the memory model's, when the planner has one)
    limits a wave to the sequences the KV-cache pool holds."""
    ex = RS.expected(cfg)
    setup = RS.setup_of(cfg, ex.lengths)
    if estimate is not None:
        setup = setup.with_(rollout=replace(setup.rollout, kv_capacity_seqs=S.kv_seqs(setup, estimate)))
    if run is None:
        f, how = F.factors_for(setup.group)
    else:
        m = C.from_run(run)
        rs = run_setup(run, cfg, m)
        steps = f"steps {m.steps[0]}-{m.steps[-1]}" if len(m.steps) > 1 else f"step {m.steps[0]}"
        base, _ = F.factors_for(rs.group)
        f = C.fill(C.fit_run(rs, m.phases, f"fitted on {run} ({steps}, median)", base), F.shipped())
        how = (
            f"fitted on RUN={run}, {steps}; reshard/reward from the A3 factors where the run has none; "
            "the fixed costs (launches, collective latency, a fixed cost a phase) kept from the group's shipped factors"
        )
    return TimePlan(T.step(setup, f), ex.how, how, validation=V.estimate(cfg, setup, f))


G = "time"


def check(ctx, run: Path | None = None, search: bool = False) -> TimePlan | None:
    """The planner's time group: one INFO line with the prediction, or a FAIL naming the fix (a RUN folder
    without timings, expected lengths beyond the maxima); skipped while the layout or batch fails. With
    `search`, the layout search's result rides on the returned TimePlan (`search_lines`)."""
    bad = ctx.failed("layout") + [r for r in ctx.failed("batch") if r.startswith(("verl.", "launch."))]
    if bad or ctx.arch is None:
        ctx.skip(G, "step time", f"fix the layout and values first ({'; '.join(bad) or 'see above'})")
        return None
    try:
        tp = plan_time(ctx.cfg, run, ctx.estimate)
    except UserError as e:
        rule = "RUN folder" if isinstance(e, C.CalibrationError) else "expected lengths"
        ctx.add(G, rule, False, e.args[0] if e.args else str(e), e.fix or "")
        return None
    except (ValueError, TypeError, ZeroDivisionError, OverflowError, KeyError, OmegaConfBaseException) as e:
        ctx.add(
            G,
            "step time",
            False,
            f"the step-time model cannot use these values: {e}",
            "fix the values the rules above name; docs/plan-time.md lists what the model reads",
        )
        return None
    st = tp.step
    ctx.note(
        G,
        "step time",
        f"{st.step_s:.1f} s a step, {st.tokens_per_s_per_device:.1f} tokens/s a device"
        + (f" ({st.tokens_per_s_per_card:.1f} a card)" if st.setup.group.dies_per_device > 1 else "")
        + f"; dominant: {LABEL[st.dominant()]}",
        f"factors: {tp.factors_how}; the phases below",
    )
    if search:
        res = S.search(ctx.cfg, st.setup, st.factors)
        tp.search_lines = res.lines(st.setup)
    return tp


def fill(p, tp: TimePlan | None) -> None:
    """The prediction into the planner's Plan (its JSON keys: time_s, step_s, tokens_per_s_per_*)."""
    if tp is None:
        return
    doc = tp.json()
    p.time_s = doc["time_s"]
    p.step_s = doc["step_s"]
    p.tokens_per_s_per_device = doc["tokens_per_s_per_device"]
    p.tokens_per_s_per_card = doc["tokens_per_s_per_card"]
    p.time_accuracy = doc["accuracy"]
    p.validation = doc["validation"]
    p.time_lines = ["step time per rank (tools/launch/plan/timing.py; docs/plan-time.md):", *tp.lines()]
    p.search_lines = tp.search_lines
