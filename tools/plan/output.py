"""The planner's two outputs from the same records: the text table `make plan` prints and the JSON object
`make plan ... JSON=1` prints (its keys are an interface: docs/launch.md, "make plan JSON=1")."""

from __future__ import annotations

import shutil
import textwrap
from typing import Any

from tools.plan import memory as M
from tools.plan.context import FAIL, INFO, PASS, SKIP, WARN

MARK = {PASS: "ok", WARN: "WARN", FAIL: "FAIL", SKIP: "skip", INFO: "info"}


def render(p: Any, width: int | None = None) -> str:  # p: tools.plan.Plan
    width = width or max(100, min(shutil.get_terminal_size((140, 20)).columns, 160))
    rule_w = min(max(len(r.rule) for r in p.results), 44)
    head = f"{'':5} {'rule':<{rule_w}}  values / what to do"
    lines = [f"preflight for recipe {p.recipe}", head, "-" * min(width, len(head) + 60)]
    group = None
    text_w = max(40, width - rule_w - 8)
    for r in p.results:
        if r.group != group:
            group = r.group
            lines.append(f"[{group}]")
        vals = textwrap.wrap(r.values, text_w) or [""]
        lines.append(f"{MARK[r.status]:<5} {r.rule:<{rule_w}}  {vals[0]}")
        lines += [f"{'':5} {'':<{rule_w}}  {v}" for v in vals[1:]]
        if r.message and r.status in (WARN, FAIL, SKIP, INFO):
            arrow = "fix: " if r.status in (WARN, FAIL) else ""
            for i, m in enumerate(textwrap.wrap(arrow + r.message, text_w)):
                lines.append(f"{'':5} {'':<{rule_w}}  {'  ' if i else ''}{m}")
    if p.estimate:
        lines += ["", *memory_lines(p.estimate)]
    if p.time_lines:
        lines += ["", *p.time_lines]
    if getattr(p, "mode_lines", None):
        lines += ["", *p.mode_lines]
    if getattr(p, "fault_lines", None):
        lines += ["", *p.fault_lines]
    if p.search_lines:
        lines += ["", "layout search (SEARCH=1; tools/plan/search.py):", *p.search_lines]
    counts = {s: sum(r.status == s for r in p.results) for s in (PASS, WARN, FAIL, SKIP, INFO)}
    lines.append("")
    lines.append(
        f"{'PASS' if p.ok else 'FAIL'}: {counts[PASS]} ok, {counts[WARN]} warnings, {counts[FAIL]} failures, "
        f"{counts[SKIP]} skipped ({p.seconds:.2f} s)"
    )
    return "\n".join(lines)


def memory_lines(est: M.Estimate) -> list[str]:
    unit, div = ("GiB", M.GIB) if est.phases[0].capacity >= 16 * M.GIB else ("MiB", 1024**2)
    lines = [f"memory per rank ({unit}), estimated (tools/plan/memory.py):"]
    for ph in est.phases:
        peak = f", peak {ph.peak / div:.1f} ({ph.peak_moment})" if ph.transients else ""
        lines.append(f"  {ph.name}: {ph.total / div:.1f}{peak} of {ph.capacity / div:.0f}")
        for part in ph.parts:
            if part.bytes:
                lines.append(
                    f"    {part.bytes / div:8.2f}  {part.name}" + (f"  ({part.note})" if part.note else "")
                )
        for t in ph.transients:
            if t.bytes:
                freed = f"; frees {', '.join(t.frees)}" if t.frees else ""
                lines.append(
                    f"  + {t.bytes / div:8.2f}  {t.name} (transient{freed})"
                    + (f"  ({t.note})" if t.note else "")
                )
    return lines


def gib(n: int | float) -> float:
    return round(n / M.GIB, 3)


def as_json(p: Any) -> dict[str, Any]:  # p: tools.plan.Plan
    """One JSON object; the keys are documented in docs/launch.md and read by tools that compare runs."""
    memory: dict[str, Any] = {}
    if p.estimate:
        for ph in p.estimate.phases:
            memory[ph.name] = {
                "components": {part.name: gib(part.bytes) for part in ph.parts},
                "transients": {t.name: gib(t.bytes) for t in ph.transients},
                "resident_gib": gib(ph.total),
                "peak_gib": gib(ph.peak),
                "peak_moment": ph.peak_moment,
                "capacity_gib": gib(ph.capacity),
            }
    return {
        "recipe": p.recipe,
        "ok": p.ok,
        "fits": p.fits,
        "memory": memory,
        "time_s": dict(p.time_s),
        "step_s": p.step_s,
        "tokens_per_s_per_device": p.tokens_per_s_per_device,
        "tokens_per_s_per_card": p.tokens_per_s_per_card,
        "time_accuracy": p.time_accuracy,
        "validation": p.validation,
        "modes": [{"mode": m.mode, **m.json()} for m in getattr(p, "modes", [])],
        "rules": [r.as_json() for r in p.results],
        "seconds": round(p.seconds, 3),
    }
