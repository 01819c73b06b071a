"""Refit the step-time model's factors (calibrate.py, factors.py) and print its validation (accuracy.py):

.venv-current-cpu/bin/python -m tools.plan.refit                    # [a3] from the seed run
.venv-current-cpu/bin/python -m tools.plan.refit --validate         # docs/plan-time.md's table
.venv-current-cpu/bin/python -m tools.plan.refit --validate --write-docs   # ... written into it
.venv-current-cpu/bin/python -m tools.plan.refit --run outputs/current/tiny-cpu --family cpu
.venv-current-cpu/bin/python -m tools.plan.refit --run <run A> --run <run B> --family cpu  # + fixed costs
.venv-current-cpu/bin/python -m tools.plan.refit --predict <run folder> --family cpu
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from omegaconf import OmegaConf

from tools.errors import run_cli
from tools.plan import accuracy as A
from tools.plan import calibrate as C
from tools.plan import calibrate_pair as CP
from tools.plan import factors as F
from tools.plan import timeplan
from tools.plan import timing as T


def predict_run(run: Path, family: str) -> str:
    """A run folder's measured phases (median of its steps) against the prediction for its own config and
    mean lengths with the shipped `family` factors (not refitted): markdown rows."""
    m = C.from_run(run)
    setup = timeplan.run_setup(run, OmegaConf.load(run / "config.yaml"), m)
    st = T.step(setup, F.shipped(family))
    pred = {**st.seconds(), "step": st.step_s}
    rows = []
    for p, v in m.phases.items():
        rows.append(f"| {run.name} | {p} | {v:.2f} | {pred[p]:.2f} | {(pred[p] - v) / v:+.1%} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=C.REFIT, description=__doc__.split("\n")[0])
    ap.add_argument("--validate", action="store_true", help="print the validation table (markdown)")
    ap.add_argument(
        "--write-docs", action="store_true", help="with --validate: write it into docs/plan-time.md"
    )
    ap.add_argument(
        "--run",
        action="append",
        help="fit on this run folder (make train's) instead of the seed run; twice: on two runs of one "
        "stack, with a fixed cost a phase (calibrate.fit_pair)",
    )
    ap.add_argument("--family", default="cpu", help="the factors.toml section a --run fit replaces")
    ap.add_argument(
        "--predict", help="print a run folder's measured phases against the --family factors' prediction"
    )
    args = ap.parse_args(argv)
    if args.validate:
        if args.write_docs:
            A.write_doc_table()
            print(f"wrote the accuracy table into {A.DOC}")
        else:
            print(A.table(A.validate()))
        return 0
    if args.predict:
        print(predict_run(Path(args.predict), args.family))
        return 0
    if args.run:
        if len(args.run) > 2:
            ap.error("--run: one run folder, or two")
        runs, setups = [Path(r) for r in args.run], []
        for run in runs:
            m = C.from_run(run)
            setups.append((timeplan.run_setup(run, OmegaConf.load(run / "config.yaml"), m), m))
        steps = [
            f"steps {m.steps[0]}-{m.steps[-1]}" if len(m.steps) > 1 else f"step {m.steps[0]}"
            for _, m in setups
        ]
        what = " and ".join(f"{r.name} ({st}, median)" for r, st in zip(runs, steps, strict=True))
        if len(runs) == 2:
            fitted = C.fit_pair(
                (setups[0][0], setups[0][1].phases),
                (setups[1][0], setups[1][1].phases),
                f"fitted on the run folders {what}: rates and a fixed cost a phase (fit_pair)",
            )
        else:
            base = F.shipped(args.family) if args.family in F.families() else F.shipped()
            fitted = C.fit_run(setups[0][0], setups[0][1].phases, f"fitted on the run folder {what}", base)
        f = C.fill(fitted, F.shipped())
        F.write_factors(args.family, f)
        for k, v, what in f.described():
            print(f"{k:20} {v:>10}  {what}")
        print(f"wrote {F.FACTORS}")
        return 0
    _, f = C.fit_seed()
    F.write_factors("a3", f)
    _, fc, rows = CP.fit_cann()
    F.write_factors("a3-cann", fc)
    res = A.validate()
    print(
        "the seed and the random-weights run solved for a rate and a fixed cost (calibrate_pair.pair_rows):"
    )
    for what, x, y in rows:
        print(f"  {what}: {x:.4g}, {y:.4g}")
    for fam in ("a3", "a3-cann"):
        f = replace(F.shipped(fam), accuracy=A.stated(res, fam))
        F.write_factors(fam, f)
        print(f"[{fam}] {f.source}\n  stated accuracy: {f.accuracy}")
        for k, v, what in f.described():
            print(f"  {k:20} {v:>10}  {what}")
    print(f"wrote {F.FACTORS}")
    return 0


if __name__ == "__main__":
    run_cli(main)
