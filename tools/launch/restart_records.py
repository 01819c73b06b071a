"""Each restart of `make train` (tools/launch/restart.py) in the run folder's metrics.jsonl: a row
{"step": the step resumed from, "kind": "restart", "attempt", "cause", "process", "line", "failed_at_step",
"resumed_from", "lost_steps", "lost_s", "stopped_at", "to_first_step_s", "damaged_step", "damage"}:
to_first_step_s filled in when the next attempt trains its first step, the last two set when the latest
checkpoint was damaged and the restart fell back to the one before it; the terminal gets the same in words."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools import atomic, records
from tools.launch.checkpoints import Damage
from tools.launch.restart import Fault, Restart, first_step_after, lost_work

Log = Callable[[str], Any]


def _rows(folder: Path) -> list[dict[str, Any]]:
    path = folder / "metrics.jsonl"
    return records.read_jsonl(path) if path.exists() else []


def _write(folder: Path, rows: list[dict[str, Any]]) -> None:
    atomic.write_bytes(folder / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())


def add(folder: Path, attempt: int, fault: Fault, timeline: dict[str, Any], trained: list[int],
        resumed_from: int, stopped_at: float, log: Log, damage: Damage | None = None) -> Restart:  # fmt: skip
    """The restart's row in metrics.jsonl (after the records a resume kept) and its line on the terminal;
    `damage`: the latest checkpoint was damaged and `resumed_from` is the intact one before it."""
    last = max(trained) if trained else resumed_from
    lost_steps, lost_s = lost_work(timeline, resumed_from, last)
    r = Restart(attempt, fault.kind, fault.process, fault.line, fault.step, resumed_from, lost_steps, lost_s,
                stopped_at, None, *((damage.step, damage.problem) if damage else (None, None)))  # fmt: skip
    _write(folder, [*_rows(folder), r.row()])
    log(r.line_out())
    return r


def first_step(folder: Path, timeline: dict[str, Any], log: Log) -> float | None:
    """The last restart's `to_first_step_s` from the attempt after it (its timeline); None when that attempt
    trained no step."""
    at = first_step_after(timeline)
    rows = _rows(folder)
    last = max((i for i, r in enumerate(rows) if r.get("kind") == "restart"), default=None)
    if at is None or last is None or rows[last].get("to_first_step_s") is not None:
        return None
    seconds = at - float(rows[last]["stopped_at"])
    rows[last]["to_first_step_s"] = round(seconds, 1)
    _write(folder, rows)
    log(
        f"restart after attempt {rows[last]['attempt']}: the first step again {seconds:.0f} s after the run was stopped"
    )
    return seconds
