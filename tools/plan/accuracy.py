"""How well the step-time model predicts the published runs (published.toml) with the shipped A3 factors,
never refitted per run: the table docs/plan-time.md carries (`python -m tools.plan.refit --validate
--write-docs` writes it; a test fails when it is stale)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from tools import atomic
from tools.plan import timing as T
from tools.plan.calibrate import published
from tools.plan.factors import shipped


def validate() -> list[dict[str, Any]]:
    """Every published run predicted with the shipped A3 factors (never refitted per run); `forced`: the
    same with the Ascend fixed costs applied on other software stacks too (they are left out there)."""
    out = []
    for r in published():
        f = shipped(r.factors)
        st = T.step(r.setup, f)
        forced = T.step(r.setup, replace(f, stack=r.setup.group.chip.stack))
        pred = {**st.seconds(), "step": st.step_s}
        pred_forced = {**forced.seconds(), "step": forced.step_s}
        rows = {}
        for p, v in r.measured.items():
            rows[p] = (v, pred[p], (pred[p] - v) / v, (pred_forced[p] - v) / v)
        out.append({"run": r, "predicted": pred, "rows": rows, "step": st})
    return out


def held_out_totals(results: list[dict[str, Any]], within: float = 0.15) -> tuple[list[str], list[str]]:
    """(runs whose step is held out, those of them within `within`)."""
    held = [res for res in results if "step" in res["rows"] and "step" not in res["run"].fitted]
    return [r["run"].name for r in held], [r["run"].name for r in held if abs(r["rows"]["step"][2]) <= within]


def stated(results: list[dict[str, Any]], family: str) -> str:
    """What the model claims for a factors family: its held-out step totals on the same software stack
    (the error of each), and how many of them are within 15%."""
    rows = [
        (res["run"], res["rows"]["step"][2])
        for res in results
        if res["run"].factors == family
        and "step" in res["rows"]
        and "step" not in res["run"].fitted
        and res["run"].setup.group.chip.stack == "ascend"
    ]
    if not rows:
        return "no held-out published step on this stack: the fitted runs are reproduced by construction"
    errs = ", ".join(f"{r.name.split(',')[0]} {e:+.0%}" for r, e in rows)
    ok = sum(abs(e) <= 0.15 for _, e in rows)
    return f"held-out Ascend step totals {errs} ({ok} of {len(rows)} within 15%; docs/plan-time.md)"


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| run | use | phase | measured s | predicted s | error | error, Ascend fixed costs on every stack |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for res in results:
        r = res["run"]
        for p, (m, pr, err, forced) in res["rows"].items():
            use = ("fit" if p in r.fitted else "held out") + (f" ({r.factors})" if r.factors != "a3" else "")
            other = f"{forced:+.1%}" if r.setup.group.chip.stack != "ascend" else "="
            lines.append(f"| {r.name} | {use} | {p} | {m:.1f} | {pr:.1f} | {err:+.1%} | {other} |")
    held, ok = held_out_totals(results)
    lines += [
        "",
        f"Held-out step totals within 15%: {len(ok)} of {len(held)}"
        + (f" ({'; '.join(ok)})." if ok else "."),
    ]
    return "\n".join(lines)


BEGIN = "<!-- accuracy table: python -m tools.plan.refit --validate --write-docs -->"
END = "<!-- end of the accuracy table -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "plan-time.md"


def doc_table(path: Path = DOC) -> str:
    text = path.read_text()
    return text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip("\n")


def write_doc_table(path: Path = DOC) -> None:
    text = path.read_text()
    head, tail = text[: text.index(BEGIN) + len(BEGIN)], text[text.index(END) :]
    atomic.write_bytes(path, (head + "\n" + table(validate()) + "\n" + tail).encode())
