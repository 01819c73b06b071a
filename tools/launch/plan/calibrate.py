"""Fit the step-time model's efficiency factors to measured phase times, and check it on published runs.

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

    .venv-current-cpu/bin/python -m tools.launch.plan.refit              # refit, rewrite factors.toml
    .venv-current-cpu/bin/python -m tools.launch.plan.refit --validate   # docs/plan-time.md's table

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

from tools import atomic
from tools.errors import UserError
from tools.launch import report as Rep
from tools.launch.plan import hardware as H
from tools.launch.plan import memory as M
from tools.launch.plan import timing as T
from tools.launch.report.runs import get as metric

HERE = Path(__file__).resolve().parent
PUBLISHED = HERE / "published.toml"
FACTORS = HERE / "factors.toml"
MODELS = HERE.parents[2] / "recipes" / "model"
REFIT = "python -m tools.launch.plan.refit"


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
            lengths=T.Lengths.of(r["prompt"], r["response"], r["response_max"]),
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


def fit(s: T.Setup, measured: dict[str, float], source: str) -> T.Factors:
    """Factors that reproduce `measured` (phase -> seconds, with 'step') for Setup s."""
    missing = [p for p in ("generate", "old_log_prob", "update", "step") if p not in measured]
    if missing:
        raise CalibrationError(
            f"no measured time for {', '.join(missing)}",
            fix="calibrate on a run whose metrics have timing_s/gen (or generate_sequences), "
            "timing_s/old_log_prob, timing_s/update_actor and timing_s/step",
        )
    w = T.work(s)

    def fixed(p: str) -> float:
        return sum(t.seconds for t in w.fixed[p])

    fwd_ideal = w.forward_compute["old_log_prob"]
    fwd_left = _residual(measured["old_log_prob"], fixed("old_log_prob"), "old_log_prob")
    if s.actor.reference and measured.get("ref"):
        fwd_ideal += w.forward_compute["ref"]
        fwd_left += _residual(measured["ref"], fixed("ref"), "ref")
    forward_mfu = fwd_ideal / fwd_left
    train_mfu = w.train_compute / _residual(measured["update"], fixed("update"), "update")
    decode_left = measured["generate"] - w.forward_compute["prefill"] / forward_mfu - fixed("generate")
    decode_bw = w.decode_memory / _residual(decode_left, 0.0, "generate")
    reshard = measured.get("reshard")
    reshard_bw = w.reshard_link / _residual(reshard, fixed("reshard"), "reshard") if reshard else math.nan
    reward = measured.get("reward")
    phases = sum(measured.get(p, 0.0) for p in T.PHASES if p != "other")
    other = max(measured["step"] - phases, 0.0)
    return T.Factors(
        train_mfu=train_mfu,
        forward_mfu=forward_mfu,
        decode_bw=decode_bw,
        reshard_bw=reshard_bw,
        reward_s_per_token=(reward / w.response_tokens) if reward is not None else math.nan,
        other_s_per_token=other / w.tokens,
        source=source,
    )


def fill(f: T.Factors, default: T.Factors) -> T.Factors:
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


# ---- the shipped factors ----


FIELDS = ("train_mfu", "forward_mfu", "decode_bw", "reshard_bw", "reward_s_per_token", "other_s_per_token")
HEADER = """# Step-time model factors a hardware family (tools/launch/plan/timing.py Factors), each with how it was made.
# [a3]: fitted on the calibration run of published.toml by `python -m tools.launch.plan.refit`
#       (tests/launch/test_plan_time.py checks that a refit reproduces it).
# [cpu]: fitted on a `make train` run folder of this machine by
#       `python -m tools.launch.plan.refit --run <run folder> --family cpu` (the run is not in the
#       repository: its figures are in docs/plan-time.md)."""


def write_factors(family: str, f: T.Factors, path: Path = FACTORS) -> None:
    """Replace the [family] section of factors.toml, keeping the others."""
    doc = tomllib.loads(path.read_text()) if path.is_file() else {}
    doc[family] = {k: getattr(f, k) for k in FIELDS} | {"source": f.source}
    lines = [HEADER]
    for fam in sorted(doc):
        lines.append(f"[{fam}]")
        lines += [f"{k} = {doc[fam][k]!r}" for k in (*FIELDS, "source")]
    atomic.write_bytes(path, ("\n".join(lines) + "\n").encode())


def shipped(family: str = "a3", path: Path = FACTORS) -> T.Factors:
    return T.Factors(**tomllib.loads(path.read_text())[family])


def families(path: Path = FACTORS) -> set[str]:
    return set(tomllib.loads(path.read_text()))


def fit_seed() -> tuple[Published, T.Factors]:
    seed = next(r for r in published() if r.use == "calibration")
    return seed, fit(seed.setup, seed.measured, f"fitted on {seed.name} ({REFIT})")


def factors_for(group: H.Group) -> tuple[T.Factors, str]:
    """The default factors of a hardware group, and what to say about them."""
    family = group.key.split("-", 1)[0].lower()
    if family == "a3":
        return shipped(), "fitted on the seed run (A3)"
    if family in families():
        f = shipped(family)
        return f, f"{f.source} (this machine's calibration)"
    return (
        shipped(),
        f"the A3 factors (no {group.key} calibration shipped: `make plan RUN=<a run here>` fits one)",
    )


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


# ---- validation table ----


def validate() -> list[dict[str, Any]]:
    f = shipped()
    out = []
    for r in published():
        st = T.step(r.setup, f)
        pred = st.seconds()
        pred["step"] = st.step_s
        rows = {}
        for p, v in r.measured.items():
            rows[p] = (v, pred.get(p), (pred.get(p) - v) / v if pred.get(p) is not None else None)
        out.append({"run": r, "predicted": pred, "rows": rows, "step": st})
    return out


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| run | use | phase | measured s | predicted s | error |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for res in results:
        r = res["run"]
        for p, (m, pr, err) in res["rows"].items():
            lines.append(f"| {r.name} | {r.use} | {p} | {m:.1f} | {pr:.1f} | {err:+.1%} |")
    return "\n".join(lines)
