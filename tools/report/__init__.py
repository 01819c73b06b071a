"""Run reports: `make report RUN=<run folder or metrics file> [RUN=<another> ...]`, for a live or a finished
run, and the lines `make train` prints at its end. One implementation for both: `make train` calls
`finish` with its run folder, which writes the same page `make report` does.

    runs.py      reading a run: verl's metrics, make train's records, the reward tally, the folder's files
    table.py     the step table in the published run's columns (steps.md, steps.jsonl)
    summary.py   what ran: recipe, overrides, versions, commit and patch series, hardware, layout, attempts
    health.py    the health curves and the reward split: verl's metric names, how to read them, why absent
    plots.py     the PNGs (one style, Agg canvas)
    page.py      the HTML pieces; build.py puts the sections together
    terminal.py  the end-of-run lines

Output (default <run folder>/report/; with several runs <their common folder>/compare/<a>_vs_<b>/):
report.html, one self-contained page (the PNGs embedded as data: URIs, readable offline), the PNGs beside
it, and for one run steps.md and steps.jsonl (one object a step, the table's numbers).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools import atomic
from tools.report import build, terminal
from tools.report.runs import Devices, ReportError, Run, find_metrics, labels, read
from tools.report.table import (
    COLUMNS,
    SPLIT,
    generation_and_reshard,
    markdown,
    row_from_metrics,
    tokens_per_s_per_device,
)

__all__ = [
    "COLUMNS",
    "SPLIT",
    "Devices",
    "Report",
    "ReportError",
    "Run",
    "end_lines",
    "find_metrics",
    "finish",
    "generation_and_reshard",
    "load",
    "main",
    "markdown",
    "read",
    "row_from_metrics",
    "tokens_per_s_per_device",
    "write",
]


@dataclass
class Report:
    rows: list[dict[str, Any]]  # the first run's
    unit: str
    files: dict[str, Path] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)


def load(run: Path) -> dict[int, dict[str, Any]]:
    """step -> merged metrics of the training steps (later files win a step)."""
    return read(run).steps


def default_out(runs: list[Run]) -> Path:
    if len(runs) == 1:
        return runs[0].folder / "report"
    common = Path(os.path.commonpath([str(r.folder.resolve()) for r in runs]))
    name = "_vs_".join(re.sub(r"[^A-Za-z0-9._-]+", "-", r.label) for r in runs)
    return common / "compare" / name[:200]


def write(
    run: Path | str | list[Path | str], out: Path | None = None, devices: float | None = None
) -> Report:
    """Read the run(s), write the report into `out`; several runs are overlaid on one page."""

    paths = [Path(p) for p in (run if isinstance(run, list) else [run])]
    names = labels(paths) if len(paths) > 1 else [None]
    runs = [read(p, label) for p, label in zip(paths, names, strict=True)]
    for r in runs:
        if not r.steps:
            raise ReportError(
                f"{r.path}: no training step in the metrics yet (records with timing_s/step)",
                fix="wait for the first step of a live run, or check RUN=",
            )
        if devices is not None:
            d = r.dev
            r.dev = Devices(ranks=devices * d.dies_per_device, dies_per_device=d.dies_per_device, unit=d.unit)
    out = Path(out) if out else default_out(runs)
    out.mkdir(parents=True, exist_ok=True)
    built = build.build(runs, out)
    rep = Report(built.rows[0], runs[0].dev.unit, runs=runs)
    if len(runs) == 1:
        rows = built.rows[0]
        atomic.write_bytes(out / "steps.md", markdown(rows, rep.unit).encode())
        atomic.write_bytes(out / "steps.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
        rep.files.update({"steps.md": out / "steps.md", "steps.jsonl": out / "steps.jsonl"})
    for name, data in built.images.items():
        atomic.write_bytes(out / name, data)
        rep.files[name] = out / name
    atomic.write_bytes(out / "report.html", built.html.encode())
    rep.files["report.html"] = out / "report.html"
    return rep


def end_lines(run: Path | Run, report_page: Path | None = None) -> list[str]:
    """The lines `make train` prints at the end of an attempt (tools/report/terminal.py)."""

    return terminal.end_lines(run if isinstance(run, Run) else read(run), report_page)


def finish(run: Path) -> list[str]:
    """`make train`'s end: write the run's report and return the lines to print. A report that cannot be
    written costs the run nothing: its line says why."""
    page = None
    note = None
    try:
        rep = write(run)
        page = rep.files["report.html"]
        lines = end_lines(rep.runs[0], page)
    except Exception as e:  # the run is done and saved: the report is an extra
        note = f"report not written: {e} (make report RUN={run} tries again)"
        try:
            lines = end_lines(Path(run))
        except Exception:
            lines = []
    return [*lines, *([note] if note else [])]


def main(args: Any) -> int:
    runs = args.run if isinstance(args.run, list) else [args.run]
    runs = [r for x in runs for r in re.split(r"[\s,]+", x) if r]  # RUN='a b' or RUN=a,b
    runs = list(dict.fromkeys(make_runs(getattr(args, "make_pid", None)) or runs))
    rep = write(runs if len(runs) > 1 else runs[0], Path(args.out) if args.out else None, args.devices)
    if len(rep.runs) == 1:
        print(markdown(rep.rows, rep.unit), end="")
    else:
        print(f"compared {len(rep.runs)} runs: {', '.join(r.label for r in rep.runs)}")
    print(f"wrote {', '.join(str(p) for p in rep.files.values())}")
    return 0


def make_runs(pid: str | None) -> list[str]:
    """`make report RUN=a RUN=b`: make keeps only the last RUN=, so read every RUN= of make's own command
    line (/proc/<make pid>/cmdline, Linux); [] elsewhere or when there is at most one."""
    if not pid:
        return []
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []
    if not argv or "make" not in os.path.basename(argv[0]):
        return []
    found = [a[len("RUN=") :] for a in argv if a.startswith("RUN=")]
    found = [r for x in found for r in re.split(r"[\s,]+", x) if r]
    return found if len(found) > 1 else []
