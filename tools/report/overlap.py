"""Did generation and training overlap? A per-step timeline, the overlap ratio and the trainer's idle time.

Two sources, both written by `make train` into the run folder:
- the trainer's phases: verl's `timing_s/<phase>` of each step (how long the driver spent in it), placed
  on the wall clock from the moment the launcher saw the step's metrics line (timeline.json `steps`, less
  `timing_s/testing` where the step ended with a validation); within a step verl 0.9.1's V1 trainer runs
  them in this order (trainer_base.py fit/_step_once, on_step_end): PHASES below;
- when each side computed: activity-<attempt>.jsonl (tools/launch/activity.py), the CPU seconds of the
  rollout's processes (vLLM) and of the trainer's (Megatron workers) every 0.1 s. A side is busy in a
  sample when it used >= BUSY_CORES of a core.

Figures (over the training window, from the first step's start to the last step's end):
- overlap ratio: the share of the rollout's busy time during which the trainer was busy too (0: nothing
  overlapped, as in sync; near 1: generation hidden behind training);
- trainer idle fraction (measured): the share of the window in which the trainer's processes were not busy;
- trainer wait fraction (verl): sum of timing_s/gen / sum of timing_s/step: the driver waiting for a batch
  (in sync mode this is the whole generation).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.records import read_jsonl
from tools.report import page as P
from tools.report.plots import WIDE, _figure, png

BUSY_CORES = 0.25
# verl 0.9.1 V1: on_step_begin, _step_once (gen, reward, old_log_prob, ref, adv, update_actor),
# save_checkpoint, on_step_end (update_weights)
PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "save_checkpoint", "update_weights")


@dataclass
class Span:
    name: str
    start: float  # seconds since the window's start
    end: float


@dataclass
class Overlap:
    mode: str
    steps: dict[int, list[Span]]  # step -> its trainer phases on the wall clock
    busy: dict[str, list[Span]]  # role -> merged busy intervals (measured)
    window: tuple[float, float]
    step_s: dict[int, float]
    overlap_ratio: float | None
    trainer_idle: float | None
    trainer_wait: float | None
    notes: list[str] = field(default_factory=list)

    def median_step_s(self, skip_first: bool = True) -> float | None:
        xs = [v for k, v in sorted(self.step_s.items()) if not (skip_first and k == min(self.step_s))]
        return statistics.median(xs) if xs else None

    def line(self) -> str:
        def pct(x: float | None) -> str:
            return "-" if x is None else f"{x:.0%}"

        med = self.median_step_s()
        return (
            f"mode {self.mode}: step {'-' if med is None else f'{med:.2f} s'} (median after step 1); "
            f"overlap ratio {pct(self.overlap_ratio)} of the rollout's busy time; trainer idle "
            f"{pct(self.trainer_idle)} (measured), waiting for a batch {pct(self.trainer_wait)} (timing_s/gen)"
        )


def _activity(folder: Path, attempt: str) -> list[dict[str, float]]:
    path = folder / f"activity-{attempt}.jsonl"
    if not path.is_file():
        return []
    return read_jsonl(path)  # a line cut by a stop is skipped


def _merge(spans: list[Span]) -> list[Span]:
    out: list[Span] = []
    for s in sorted(spans, key=lambda s: s.start):
        if out and s.start <= out[-1].end + 0.05:  # samples ~0.1 s apart: touching spans
            out[-1].end = max(out[-1].end, s.end)
        else:
            out.append(Span(s.name, s.start, s.end))
    return out


def _length(spans: list[Span], lo: float, hi: float) -> float:
    return sum(max(0.0, min(s.end, hi) - max(s.start, lo)) for s in spans)


def _intersect(a: list[Span], b: list[Span]) -> list[Span]:
    out = []
    for x in a:
        for y in b:
            lo, hi = max(x.start, y.start), min(x.end, y.end)
            if hi > lo:
                out.append(Span("both", lo, hi))
    return out


def analyse(
    timeline: dict[str, Any], steps: dict[int, dict[str, Any]], folder: Path, mode: str
) -> Overlap | None:
    """The overlap of the run's last attempt that trained; None without step timestamps."""
    attempts = [(k, a) for k, a in sorted(timeline.items(), key=lambda kv: int(kv[0])) if a.get("steps")]
    if not attempts:
        return None
    key, att = attempts[-1]
    t0 = float(att["start"])
    phases: dict[int, list[Span]] = {}
    step_s: dict[int, float] = {}
    for s_str, seen in sorted(att["steps"].items(), key=lambda kv: int(kv[0])):
        s = int(s_str)
        m = steps.get(s) or {}
        total = m.get("timing_s/step")
        if total is None:
            continue
        end = float(seen) - float(m.get("timing_s/testing") or 0.0)
        start = end - float(total)
        step_s[s] = float(total)
        t, spans = start, []
        for name in PHASES:
            d = m.get(f"timing_s/{name}")
            if d:
                spans.append(Span(name, t, t + float(d)))
                t += float(d)
        if t < end:
            spans.append(Span("other", t, end))
        phases[s] = spans
    if not phases:
        return None
    lo = min(sp[0].start for sp in phases.values())
    hi = max(sp[-1].end for sp in phases.values())
    rows = _activity(folder, key)
    busy: dict[str, list[Span]] = {"rollout": [], "trainer": []}
    for r in rows:
        t1 = float(r["t"]) - t0
        dt = float(r.get("dt") or 0.1)
        for role in busy:
            if float(r.get(role, 0.0)) >= BUSY_CORES * dt:
                busy[role].append(Span(role, t1 - dt, t1))
    busy = {k: _merge(v) for k, v in busy.items()}
    notes = []
    overlap = idle = None
    if rows:
        roll = _length(busy["rollout"], lo, hi)
        both = _length(_intersect(busy["rollout"], busy["trainer"]), lo, hi)
        overlap = both / roll if roll > 0 else 0.0
        idle = 1.0 - _length(busy["trainer"], lo, hi) / (hi - lo) if hi > lo else None
    else:
        notes.append(f"no activity-{key}.jsonl: the run predates the activity sampler; overlap not measured")
    gens = [float(steps[s].get("timing_s/gen") or 0.0) for s in phases]
    tot = [step_s[s] for s in phases]
    wait = sum(gens) / sum(tot) if sum(tot) else None
    return Overlap(mode, phases, busy, (lo, hi), step_s, overlap, idle, wait, notes)


def of_run(run: Any) -> Overlap | None:
    """The overlap of a report's Run (tools/report/runs.py); None for a run without a trainer mode
    in its config and without an activity record (a metrics file alone, an older run)."""
    from tools.recipes.mode import trainer_mode  # omegaconf: only for a run that has a config

    if run.config is None or not run.timeline:
        return None
    return analyse(run.timeline, run.steps, run.folder, trainer_mode(run.config))


def section(runs: list[Any], images: dict[str, bytes]) -> str | None:
    """The report's "Did generation and training overlap" section; None when no run has the records."""
    found = [(r, of_run(r)) for r in runs]
    found = [(r, ov) for r, ov in found if ov is not None]
    if not found:
        return None
    figs, lines = [], []
    for i, (r, ov) in enumerate(found):
        name = f"timeline-{i}.png" if len(found) > 1 else "timeline.png"
        data = timeline_png(ov, f"{r.label}: {ov.mode}")
        images[name] = data
        figs.append(P.figure(name, data,
            "Top: the trainer's phases per step (verl's <code>timing_s/*</code>, placed by the step's end as "
            "make train saw it; dotted: a step's start). Middle and bottom: when the trainer's and the "
            "rollout's processes used CPU (activity-N.jsonl, every 0.1 s, busy at >= "
            f"{BUSY_CORES} of a core).", wide=True))  # fmt: skip
        lines.append(P.esc((f"{r.label}: " if len(found) > 1 else "") + ov.line() + " ".join(ov.notes)))
    body = (
        f'<div class="figs">{"".join(figs)}</div><p>'
        + "<br>".join(lines)
        + (
            "</p><p>Overlap ratio: the share of the rollout's busy time during which the trainer was busy too. "
            "Trainer idle: the share of the training window in which the trainer's processes did not compute. "
            "Waiting for a batch: sum of <code>timing_s/gen</code> over sum of <code>timing_s/step</code> (in sync "
            "mode, the whole generation). docs/async.md explains the modes.</p>"
        )
    )
    return P.section("overlap", "Did generation and training overlap", body)


COLORS = {
    "gen": "#d62728",
    "reward": "#bcbd22",
    "old_log_prob": "#1f77b4",
    "ref": "#17becf",
    "adv": "#8c564b",
    "update_actor": "#2ca02c",
    "save_checkpoint": "#7f7f7f",
    "update_weights": "#ff7f0e",
    "other": "#dddddd",
}


def timeline_png(ov: Overlap, title: str) -> bytes:
    """Three lanes over the training window: the trainer's phases (verl's timings), the trainer's measured
    busy time and the rollout's measured busy time; a step boundary is a dotted line."""
    fig, ax = _figure((WIDE[0], 2.6), bottom=0.2)
    lo, hi = ov.window
    lanes = {"rollout busy": 0, "trainer busy": 1, "trainer phases": 2}
    seen = set()
    for spans in ov.steps.values():
        for s in spans:
            ax.broken_barh([(s.start - lo, s.end - s.start)], (2 - 0.35, 0.7), color=COLORS.get(s.name, "#999"),
                           label=None if s.name in seen else s.name)  # fmt: skip
            seen.add(s.name)
        ax.axvline(spans[0].start - lo, color="#444", lw=0.6, ls=":")
    for role, lane in (("trainer", 1), ("rollout", 0)):
        bars = [(s.start - lo, s.end - s.start) for s in ov.busy.get(role, []) if s.end > lo and s.start < hi]
        ax.broken_barh(bars, (lane - 0.35, 0.7), color="#2ca02c" if role == "trainer" else "#d62728")
    ax.set_yticks(list(lanes.values()), list(lanes.keys()))
    ax.set_xlim(0, hi - lo)
    ax.set_xlabel("seconds since the first training step began")
    ax.set_title(title)
    ax.grid(axis="y", visible=False)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=5)
    fig.subplots_adjust(bottom=0.38, left=0.14)
    return png(fig)
