"""The shipped A3 factors for hicann/cann-recipes-train's optimised stack ([a3-cann] in factors.toml) and
the test that chose how they are fitted: the seed (step 27) and the random-weights run (step 5, every
optimisation of the document on) solved together for a rate and a fixed cost a phase (two lengths on one
cluster). docs/plan-time.md has the figures; `python -m tools.plan.refit` prints them."""

from __future__ import annotations

import math

from tools.plan import factors as F
from tools.plan import timing as T
from tools.plan.calibrate import REFIT, Published, fit, fit_joint, log_prob_phases, published

PREFILL_MFU = 0.2  # the prefill's share of generate is under 1 s on both runs: its efficiency is moot


def pair_rows(first: Published, second: Published) -> list[tuple[str, float, float]]:
    """Two runs of one stack solved for rate and fixed cost, phase by phase: (what, 1 / efficiency, fixed
    seconds a unit); a negative value says the runs differ by more than lengths and layout."""
    out = []
    w1, w2 = T.work(first.setup), T.work(second.setup)
    rows = []
    for r, w in ((first, w1), (second, w2)):
        ph = log_prob_phases(r.setup, r.measured)
        left = sum(r.measured[p] - sum(t.seconds for t in w.fixed[p]) for p in ph)
        upd = r.measured["update"] - sum(t.seconds for t in w.fixed["update"])
        rows.append(
            {
                "log-probs: 1/forward_mfu, layer_pass_s": (
                    sum(w.forward_compute[p] for p in ph),
                    sum(w.layer_passes[p] for p in ph),
                    left,
                ),
                "update: 1/train_mfu, layer_pass_s": (w.train_compute, w.layer_passes["update"], upd),
                "generate: 1/decode_bw, decode_collective_s": (
                    w.decode_memory,
                    w.decode_collectives,
                    r.measured["generate"]
                    - w.forward_compute["prefill"] / 0.2
                    - sum(t.seconds for t in w.fixed["generate"]),
                ),
            }
        )
    for what in rows[0]:
        a, b = rows[0][what], rows[1][what]
        det = a[0] * b[1] - a[1] * b[0]
        x = (a[2] * b[1] - a[1] * b[2]) / det if det else math.nan
        y = (a[0] * b[2] - a[2] * b[0]) / det if det else math.nan
        out.append((what, x, y))
    return out


def fit_cann() -> tuple[Published, F.Factors, list[tuple[str, float, float]]]:
    """[a3-cann], the stack of hicann/cann-recipes-train's optimised runs: the seed and the random-weights
    run were to separate rates from fixed costs (two lengths, one cluster); where the pair gives a negative
    rate or fixed cost (the optimised run is faster per unit of work in every phase: not one stack), the
    factors are the random-weights run's own rates with no fixed costs. Returns the pair's solutions too."""
    runs = published()
    seed = next(r for r in runs if r.use == "calibration" and r.factors == "a3")
    rw = next(r for r in runs if r.use == "calibration" and r.factors == "a3-cann")
    rows = pair_rows(seed, rw)
    if all(x > 0 and y >= 0 for _, x, y in rows):
        return rw, fit_joint(seed, rw, f"fitted on {seed.name} and {rw.name} ({REFIT})"), rows
    bad = "; ".join(f"{w} {x:.3g}, {y:.3g}" for w, x, y in rows if not (x > 0 and y >= 0))
    src = (
        f"fitted on {rw.name} alone: its rates, no fixed costs (the pair with the seed gives negative "
        f"values: {bad}) ({REFIT})"
    )
    return rw, fit(rw.setup, rw.measured, src), rows
