"""Fit the step-time model's efficiency factors to measured phase times (the published runs, a run folder).

A fit takes one measured step (phase seconds, mean prompt/response lengths) and the Setup it ran with:

  forward_mfu         (old_log_prob + ref ideal forward) / (their measured seconds - fixed terms): ONE
                      factor for both, so their split is a prediction, not a fit
  train_mfu           update ideal forward + backward / (measured update - fixed terms)
  decode_bw           decode ideal HBM time / (measured generate - prefill at forward_mfu)
  reshard_bw          weight gather at link peak / (measured reshard - onload/offload)
  reward_s_per_token  measured reward / response tokens
  other_s_per_token   (measured step - the phases) / tokens

Six factors from seven measured numbers: on the calibration step every phase but old_log_prob/ref is
reproduced by construction. What the model predicts is every other layout, length and hardware group.

Shipped: factors.toml, fitted on the seed run (published.toml) by

    .venv-current-cpu/bin/python -m tools.plan.refit              # refit, rewrite factors.toml
    .venv-current-cpu/bin/python -m tools.plan.refit --validate   # docs/plan-time.md's table

`make plan RUN=<run folder>` fits the same factors to that run's metrics (verl's timing_s/*) instead.
"""

from __future__ import annotations

import math
import statistics
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from tools import report as Rep
from tools.errors import UserError
from tools.plan import factors as F
from tools.plan import hardware as H
from tools.plan import memory as M
from tools.plan import timing as T
from tools.report.runs import get as metric

HERE = Path(__file__).resolve().parent
PUBLISHED = HERE / "published.toml"
MODELS = HERE.parents[1] / "recipes" / "model"
REFIT = "python -m tools.plan.refit"


class CalibrationError(UserError):
    pass


# ---- published runs ----


@dataclass(frozen=True)
class Published:
    name: str
    use: str
    source: str
    setup: T.Setup
    measured: dict[str, float]
    assumed: str
    tokens_per_s_per_card: float | None
    fitted: tuple[
        str, ...
    ] = ()  # the measured numbers the shipped factors are fitted on; the rest are checks
    factors: str = "a3"  # the factors.toml family it is fitted on or predicted with


def arch_of(name: str, models: dict[str, Any]) -> M.Arch:
    if name in models:
        return M.Arch.from_config({k: v for k, v in models[name].items() if k != "source"})
    path = MODELS / f"{name}.yaml"
    cfg = yaml.safe_load(path.read_text())
    return M.Arch.from_config(cfg["launch"]["model_config"])


def published(path: Path = PUBLISHED) -> list[Published]:
    doc = tomllib.loads(path.read_text())
    models = doc.get("model", {})
    out = []
    for r in doc["run"]:
        group = H.Group(
            key=r["hardware"],
            chip=H.CHIPS[r["hardware"]],
            nodes=r["nodes"],
            ranks_per_node=r["ranks_per_node"],
            dies_per_device=r["dies_per_device"],
        )
        actor = dict(r["actor"])
        actor["stages"] = tuple(actor["stages"])
        setup = T.Setup(
            arch=arch_of(r["model"], models),
            group=group,
            actor=T.Actor(**actor),
            rollout=T.Rollout(**r["rollout"]),
            prompts=r["prompts"],
            samples=r["samples"],
            lengths=T.Lengths.of(r["prompt"], r["response"], r["response_max"], r.get("clip_ratio")),
        )
        out.append(
            Published(
                r["name"],
                r["use"],
                r["source"],
                setup,
                dict(r["measured"]),
                r.get("assumed", ""),
                r.get("tokens_per_s_per_card"),
                tuple(r.get("fitted", ())),
                r.get("factors", "a3"),
            )
        )
    return out


# ---- fitting ----


def _residual(measured: float, fixed: float, phase: str) -> float:
    left = measured - fixed
    if left <= 0:
        raise CalibrationError(
            f"phase {phase}: the model's fixed terms ({fixed:.1f} s) already exceed the measured {measured:.1f} s",
            fix="check the run's layout (offload, optimizer on the host) matches the recipe it was timed with",
        )
    return left


def fit(
    s: T.Setup,
    measured: dict[str, float],
    source: str,
    layer_pass_s: float = 0.0,
    decode_collective_s: float = 0.0,
    phase_fixed: dict[str, float] | None = None,
) -> F.Factors:
    """Factors that reproduce `measured` (phase -> seconds, with 'step') for Setup s, the fixed costs given
    (one step cannot tell a fixed cost from a slow rate: fit_joint and fit_pair fit them on two runs).
    phase_fixed: F.PHASE_FIXED's fields (seconds a step of a phase)."""
    pf = dict.fromkeys(F.PHASE_FIXED, 0.0) | (phase_fixed or {})
    missing = [p for p in ("generate", "update", "step") if p not in measured]
    if not log_prob_phases(s, measured):
        missing.append("old_log_prob (or ref)")
    if missing:
        raise CalibrationError(
            f"no measured time for {', '.join(missing)}",
            fix="calibrate on a run whose metrics have timing_s/gen (or generate_sequences), "
            "timing_s/old_log_prob, timing_s/update_actor and timing_s/step",
        )
    w = T.work(s)

    def fixed(p: str) -> float:
        own = pf[F.PHASE_FIXED_OF[p]] if p in F.PHASE_FIXED_OF else 0.0
        return sum(t.seconds for t in w.fixed[p]) + w.layer_passes.get(p, 0.0) * layer_pass_s + own

    phases_fwd = log_prob_phases(s, measured)
    fwd_ideal = sum(w.forward_compute[p] for p in phases_fwd)
    fwd_left = sum(_residual(measured[p], fixed(p), p) for p in phases_fwd)
    forward_mfu = fwd_ideal / fwd_left
    train_mfu = w.train_compute / _residual(measured["update"], fixed("update"), "update")
    decode_left = (
        measured["generate"]
        - w.forward_compute["prefill"] / forward_mfu
        - fixed("generate")
        - w.decode_collectives * decode_collective_s
    )
    decode_bw = w.decode_memory / _residual(decode_left, 0.0, "generate")
    reshard = measured.get("reshard")
    reshard_bw = w.reshard_link / _residual(reshard, fixed("reshard"), "reshard") if reshard else math.nan
    reward = measured.get("reward")
    phases = sum(measured.get(p, 0.0) for p in T.PHASES if p != "other")
    other = max(measured["step"] - phases - pf["other_fixed_s"], 0.0)
    return F.Factors(
        train_mfu=train_mfu,
        forward_mfu=forward_mfu,
        decode_bw=decode_bw,
        reshard_bw=reshard_bw,
        reward_s_per_token=(reward / w.response_tokens) if reward is not None else math.nan,
        other_s_per_token=other / w.tokens,
        layer_pass_s=layer_pass_s,
        decode_collective_s=decode_collective_s,
        **pf,
        stack=s.group.chip.stack,
        source=source,
    )


def log_prob_phases(s: T.Setup, measured: dict[str, float]) -> tuple[str, ...]:
    """The forward-only phases a run ran and timed: old log-prob unless the recipe skips it, reference
    where there is one."""
    on = {"old_log_prob": s.actor.old_log_prob, "ref": s.actor.reference}
    return tuple(p for p in ("old_log_prob", "ref") if on[p] and measured.get(p))


def _solve2(a: tuple[float, float, float], b: tuple[float, float, float], what: str) -> tuple[float, float]:
    """x, y with a0 x + a1 y = a2 and b0 x + b1 y = b2; both must come out positive."""
    det = a[0] * b[1] - a[1] * b[0]
    if abs(det) < 1e-12 * max(abs(a[0] * b[1]), abs(a[1] * b[0]), 1e-300):
        raise CalibrationError(
            f"{what}: the two calibration runs do not tell the rate from the fixed cost (same proportions)",
            fix="calibrate on runs that differ in micro-batches, layers or decode collectives",
        )
    x = (a[2] * b[1] - a[1] * b[2]) / det
    y = (a[0] * b[2] - a[2] * b[0]) / det
    if x <= 0 or y < 0:
        raise CalibrationError(
            f"{what}: the two calibration runs give a negative rate or fixed cost ({x:.3g}, {y:.3g})",
            fix="check both runs' layouts and measured phases in published.toml",
        )
    return x, y


def _rate_and_fixed(
    rows: list[tuple[float, float, float]], what: str, fixed_only: bool = False
) -> tuple[float, float]:
    """(seconds per unit of ideal work, fixed seconds) from two runs' (ideal, count of the fixed cost,
    measured): solved exactly, or, when that gives a negative one, rate only (fitted on the first run),
    or where `fixed_only` is allowed (a per-token cost may be zero) the better of that and fixed only
    (their mean), by squared error."""
    try:
        return _solve2(rows[0], rows[1], what)
    except CalibrationError:
        pass
    rate = rows[0][2] / rows[0][0] if rows[0][0] else math.inf
    fixed = sum(r[2] / r[1] for r in rows) / len(rows)
    err_rate = sum((r[0] * rate - r[2]) ** 2 for r in rows)
    err_fixed = sum((r[1] * fixed - r[2]) ** 2 for r in rows)
    return (rate, 0.0) if err_rate <= err_fixed or not fixed_only else (0.0, fixed)


def fit_pair(
    first: tuple[T.Setup, dict[str, float]], second: tuple[T.Setup, dict[str, float]], source: str
) -> F.Factors:
    """Rates and per-phase fixed seconds from two runs of one stack (the CPU's: tiny models whose phases
    are mostly fixed costs): each phase's measured seconds = its ideal work x (1 / efficiency) + a fixed
    cost, two equations a phase (_rate_and_fixed). Old log-prob and reference share one pair. Reshard's
    ideal work (the model's bytes) is the same in both runs, so it keeps a rate only; reward is not timed
    on CPU. No launch or collective terms (one rank)."""
    (s1, m1), (s2, m2) = first, second
    w1, w2 = T.work(s1), T.work(s2)

    def fixed(w: T.Work, p: str) -> float:
        return sum(t.seconds for t in w.fixed[p])

    def fwd(s: T.Setup, w: T.Work, m: dict[str, float]) -> tuple[float, float, float]:
        ph = log_prob_phases(s, m)
        return (
            sum(w.forward_compute[p] for p in ph),
            len(ph),
            sum(_residual(m[p], fixed(w, p), p) for p in ph),
        )

    inv_fwd, lp_fixed = _rate_and_fixed([fwd(s1, w1, m1), fwd(s2, w2, m2)], "log-probs")
    inv_train, up_fixed = _rate_and_fixed(
        [
            (w.train_compute, 1.0, _residual(m["update"], fixed(w, "update"), "update"))
            for w, m in ((w1, m1), (w2, m2))
        ],
        "update",
    )
    inv_dec, gen_fixed = _rate_and_fixed(
        [
            (
                w.decode_memory,
                1.0,
                m["generate"] - w.forward_compute["prefill"] * inv_fwd - fixed(w, "generate"),
            )
            for w, m in ((w1, m1), (w2, m2))
        ],
        "generate",
    )

    def other(m: dict[str, float]) -> float:
        return max(m["step"] - sum(m.get(p, 0.0) for p in T.PHASES if p != "other"), 0.0)

    inv_other, other_fixed = _rate_and_fixed(
        [(w1.tokens, 1.0, other(m1)), (w2.tokens, 1.0, other(m2))], "other", fixed_only=True
    )
    pf = {
        "generate_fixed_s": gen_fixed,
        "log_prob_fixed_s": lp_fixed,
        "update_fixed_s": up_fixed,
        "other_fixed_s": other_fixed,
    }
    f = fit(s1, m1, source, phase_fixed=pf)  # reshard and reward as one run gives them
    return replace(
        f,
        forward_mfu=1 / inv_fwd,
        train_mfu=1 / inv_train,
        decode_bw=1 / inv_dec,
        other_s_per_token=inv_other,
    )


def fit_joint(first: Published, second: Published, source: str) -> F.Factors:
    """The shipped fit: every factor from `first` (all phases measured), except that the two fixed-cost
    factors and the two rates they share a phase with come from both runs:

      layer_pass_s, forward_mfu       first's old log-prob + reference and second's old log-prob: each is
                                      forward FLOPs / forward_mfu + layer passes x layer_pass_s + fixed
      decode_collective_s, decode_bw  first's generate and second's generate, which the second run does not
                                      time: its step less its measured phases and the model's reshard,
                                      reward, reference and other (the first run's factors)
      train_mfu                       first's update, less its layer passes at layer_pass_s

    second's update enters only the subtraction that gives its generate: the model's update for it
    (layer_pass_s from the log-probs, train_mfu from the first run) is the held-out check of both."""
    s1, s2 = first.setup, second.setup
    w1, w2 = T.work(s1), T.work(s2)
    m1, m2 = first.measured, second.measured

    def fixed(w: T.Work, p: str) -> float:
        return sum(t.seconds for t in w.fixed[p])

    def fwd_row(r: Published, w: T.Work, phases: tuple[str, ...]) -> tuple[float, float, float]:
        ideal = sum(w.forward_compute[p] for p in phases)
        count = sum(w.layer_passes[p] for p in phases)
        left = sum(_residual(r.measured[p], fixed(w, p), p) for p in phases)
        return ideal, count, left

    ph1, ph2 = log_prob_phases(s1, m1), log_prob_phases(s2, m2)
    inv_mfu, layer_pass_s = _solve2(fwd_row(first, w1, ph1), fwd_row(second, w2, ph2), "forward")
    f1 = fit(
        s1, m1, source, layer_pass_s=layer_pass_s
    )  # forward_mfu again, train_mfu, reshard, reward, other
    f1 = replace(f1, forward_mfu=1 / inv_mfu)

    # the second run's generate: its step less what it measured and the model's other phases
    pred2 = T.step(s2, f1).seconds()
    gen2 = m2.get("generate") or m2["step"] - sum(
        m2[p] if p in m2 else pred2[p] for p in T.PHASES if p != "generate"
    )

    def dec_row(s: T.Setup, w: T.Work, generate: float) -> tuple[float, float, float]:
        left = generate - w.forward_compute["prefill"] * inv_mfu - fixed(w, "generate")
        return w.decode_memory, w.decode_collectives, left

    inv_bw, decode_collective_s = _solve2(dec_row(s1, w1, m1["generate"]), dec_row(s2, w2, gen2), "decode")
    return replace(f1, decode_bw=1 / inv_bw, decode_collective_s=decode_collective_s)


def fit_run(s: T.Setup, measured: dict[str, float], source: str, base: F.Factors) -> F.Factors:
    """One run's fit: its rates, with the fixed-cost factors of `base` where `base` was fitted on this
    run's software stack (one step cannot separate them), else none."""
    same = base.stack == s.group.chip.stack
    return fit(
        s,
        measured,
        source,
        layer_pass_s=base.layer_pass_s if same else 0.0,
        decode_collective_s=base.decode_collective_s if same else 0.0,
        phase_fixed={k: getattr(base, k) if same else 0.0 for k in F.PHASE_FIXED},
    )


def fill(f: F.Factors, default: F.Factors) -> F.Factors:
    """Factors a run could not fit (no reshard or reward timing) taken from `default`, and said so."""
    kw, taken = {}, []
    for k in ("reshard_bw", "reward_s_per_token"):
        v = getattr(f, k)
        if v is None or math.isnan(v):
            kw[k] = getattr(default, k)
            taken.append(k)
    if taken:
        kw["source"] = f"{f.source}; {', '.join(taken)} from the A3 factors (not timed in the run)"
    return replace(f, **kw)


def fit_seed() -> tuple[Published, F.Factors]:
    """The shipped A3 factors: the seed run (every phase) with the partial calibration run (the fixed-cost
    factors; see fit_joint)."""
    runs = published()
    seed = next(r for r in runs if r.use == "calibration" and r.factors == "a3")
    second = next(r for r in runs if r.use == "partial calibration")
    src = f"fitted on {seed.name}; fixed costs with {second.name} ({', '.join(second.fitted)}) ({REFIT})"
    return seed, fit_joint(seed, second, src)


# ---- a run folder ----


@dataclass(frozen=True)
class Measured:
    phases: dict[str, float]
    prompt: float
    response: float
    steps: list[int]


def from_run(run: Path) -> Measured:
    """Median phase times and mean lengths of a run's training steps (step 1, the warm-up, left out when
    there are more)."""
    try:
        steps = Rep.load(run)
    except Rep.ReportError as e:
        raise CalibrationError(e.args[0] if e.args else str(e), fix=e.fix) from None
    rows = []
    for k, m in steps.items():
        gen, reshard = Rep.generation_and_reshard(m)
        rows.append(
            (
                k,
                {
                    "generate": gen,
                    "reshard": reshard,
                    "reward": metric(m, "timing_s/reward"),
                    "old_log_prob": metric(m, "timing_s/old_log_prob"),
                    "ref": metric(m, "timing_s/ref"),
                    "update": metric(m, "timing_s/update_actor"),
                    "step": metric(m, "timing_s/step", "perf/time_per_step"),
                },
                metric(m, "prompt_length/mean"),
                metric(m, "response_length/mean"),
            )
        )
    rows = [r for r in rows if r[1]["step"] and r[1]["generate"] and r[1]["update"] and r[1]["old_log_prob"]]
    if not rows:
        raise CalibrationError(
            f"{run}: no training step with timing_s/step, timing_s/gen, timing_s/old_log_prob and "
            "timing_s/update_actor",
            fix="point RUN= at a run folder of `make train` (metrics.jsonl) or at verl's file-logger JSONL "
            "of a run that finished at least one step",
        )
    if len(rows) > 1 and rows[0][0] == 1:
        rows = rows[1:]
    phases = {}
    for p in ("generate", "reshard", "reward", "old_log_prob", "ref", "update", "step"):
        vals = [r[1][p] for r in rows if r[1][p] is not None]
        if vals:
            phases[p] = statistics.median(vals)
    prompts = [r[2] for r in rows if r[2] is not None]
    responses = [r[3] for r in rows if r[3] is not None]
    if not prompts or not responses:
        raise CalibrationError(
            f"{run}: the steps have no prompt_length/mean or response_length/mean",
            fix="verl logs them with every step: is this a verl metrics file?",
        )
    return Measured(phases, statistics.mean(prompts), statistics.mean(responses), [r[0] for r in rows])
