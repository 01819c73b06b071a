"""Restarts without a person: what ended a run, whether starting it again can help, and when to give up.

`make train` runs verl under the watchdog (tools/launch/watchdog.py, supervise.py). When an attempt ends
in a failure, `classify` names its cause from the exit status, the watchdog's verdict and the attempt's
first error line:

    recoverable (a fault of the machine or of a process): worker lost, node lost, engine error, stall,
        collective timeout, out of memory
    not retried (the user's to fix, or unknown): config, data, error (any other exception: a bug retried
        would fail the same way)

For a recoverable cause and while `launch.restarts` allows (restarts counted within the last
`launch.restart_window_h` hours), the launcher starts the run again from its last sealed, verified
checkpoint (tools/launch/resume.py), towards the same last step. `give_up` stops a crash loop: an attempt
after a restart that trained no new step, or the same error twice at the same step. Pure functions: the
launcher (tools/launch/train.py) does the stopping, sealing and starting; tests/tools/launch/test_restart.py.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from tools.errors import UserError

RECOVERABLE = ("worker lost", "node lost", "engine error", "stall", "collective timeout", "out of memory")

# the first matching pattern names the cause; user errors first (a config error is never retried, whatever
# else the log says), then the machine's faults from the most to the least specific
PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(p, re.IGNORECASE))
    for kind, p in (
        ("config", r"ConfigAttributeError|ConfigKeyError|ValidationError|Could not override|MissingMandatoryValue"
                   r"|InterpolationResolutionError|hydra\.errors"),
        ("data", r"ArrowInvalid|ParquetException|FileNotFoundError|No such file or directory|UnicodeDecodeError"
                 r"|JSONDecodeError"),
        # not Ray's boilerplate on every dead worker ("(1) the process was killed by the OOM killer ..."): a
        # real OOM kill says "running low on memory"
        ("out of memory", r"OutOfMemoryError|out of memory|running low on memory|Cannot allocate memory"),
        ("collective timeout", r"HCCL.*time ?out|NCCL.*time ?out|Gloo.*time ?out|Watchdog caught collective"
                               r"|collective operation timeout|\bEI000[26]\b|DistBackendError.*[Tt]imed? ?out"),
        ("node lost", r"NodeDiedError|node .* (?:has been marked dead|died|is dead)|raylet.*(?:died|dead)"
                      r"|lost connection to the GCS|GcsRpcError|RaySystemError"),
        ("engine error", r"EngineDeadError|EngineCore.*(?:died|failed|Error)|engine core .*(?:died|dead)"),
        ("worker lost", r"A worker died or was killed|ActorDiedError|ActorUnavailableError|RayActorError|WorkerCrashedError"
                        r"|The actor died|actor died unexpectedly|died unexpectedly|SIGKILL|signal 9"),
    )
)  # fmt: skip


@dataclass(frozen=True)
class Fault:
    """What ended an attempt: `kind` (RECOVERABLE or config, data, error), who and the line that said so,
    and the step in progress (the last trained step + 1)."""

    kind: str
    process: str
    line: str
    step: int

    @property
    def recoverable(self) -> bool:
        return self.kind in RECOVERABLE

    def same_as(self, other: Fault) -> bool:
        """The same error at the same step (process ids and numbers aside)."""
        return (self.kind, self.step, _shape(self.line)) == (other.kind, other.step, _shape(other.line))


def _short(line: str, n: int = 160) -> str:
    """A first error line for the terminal (Ray's run to 1000 characters; metrics.jsonl keeps it whole)."""
    return line if len(line) <= n else line[: n - 3] + "..."


def _shape(line: str) -> str:
    return re.sub(r"\d+", "N", re.sub(r"0x[0-9a-f]+", "X", line.lower())).strip()


def classify(rc: int, timeline: dict[str, Any], step: int) -> Fault | None:
    """The cause of an attempt's end; None for a run that finished (0) or was stopped (130, 143).
    `timeline`: run_verl's (its "failure" when the watchdog stopped the run, its "first_error" when a process
    reported one); `step`: the step in progress when it ended."""
    if rc in (0, 130, 143):
        return None
    failure = timeline.get("failure") or {}
    first = timeline.get("first_error") or {}
    process = failure.get("process") or first.get("process") or "verl's driver"
    line = failure.get("first_error") or first.get("line") or ""
    for kind, pattern in PATTERNS:
        if pattern.search(line) or (kind == "engine error" and line and "EngineCore" in process):
            return Fault(kind, process, line, step)
    if failure.get("kind") == "stalled":
        return Fault("stall", process, line, step)
    if rc < 0 or rc in (137, 139):  # verl's driver killed by a signal (the kernel's OOM killer: SIGKILL)
        return Fault("worker lost", "verl's driver", line or f"killed by signal {abs(rc) % 128}", step)
    return Fault("error", process, line or f"verl exited with status {rc}", step)


@dataclass(frozen=True)
class Policy:
    """launch.restarts (how many) within launch.restart_window_h hours."""

    limit: int
    window_s: float


def policy(launch: Any) -> Policy:
    """The recipe's restart policy; a bad value is refused naming its key."""
    limit, window_h = launch.get("restarts", 0), launch.get("restart_window_h", 24)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise UserError(
            f"launch.restarts: {limit!r}",
            fix="a whole number >= 0 (0: no restart), e.g. ARGS='launch.restarts=3'",
        )
    if isinstance(window_h, bool) or not isinstance(window_h, int | float) or window_h <= 0:
        raise UserError(
            f"launch.restart_window_h: {window_h!r}",
            fix="hours > 0: restarts older than that no longer count against launch.restarts",
        )
    return Policy(limit, float(window_h) * 3600)


@dataclass
class Restart:
    """One restart, as metrics.jsonl records it ("kind": "restart", "step": the step resumed from)."""

    attempt: int  # the attempt that failed
    cause: str
    process: str
    line: str
    failed_at_step: int  # the step in progress
    resumed_from: int  # the sealed, verified checkpoint the next attempt starts from
    lost_steps: int  # trained steps after that checkpoint, trained again
    lost_s: float  # wall time since that checkpoint's step finished (or the attempt started)
    stopped_at: float  # epoch seconds: the launcher had stopped every process
    to_first_step_s: float | None = None  # from stopped_at to the next attempt's first step
    damaged_step: int | None = None  # the latest checkpoint, found damaged: resumed_from is the one before it
    damage: str | None = None  # its first damaged file, as verification named it

    def row(self) -> dict[str, Any]:
        return {"step": self.resumed_from, "kind": "restart", **asdict(self)}

    def line_out(self) -> str:
        return (
            f"restart after attempt {self.attempt}: {self.cause} at step {self.failed_at_step} ({self.process}:"
            f" {_short(self.line)});"
            f" resuming from the checkpoint of step {self.resumed_from}, {self.lost_steps} step(s) and"
            f" {self.lost_s:.0f} s of work lost"
        )


def give_up(fault: Fault, history: list[tuple[Fault, int]], trained_since: int, now: float,
            rules: Policy, starts: list[float], last: int) -> str | None:  # fmt: skip
    """Why no restart (one line), or None to restart. `history`: the faults that were restarted, with the
    step each resumed from; `trained_since`: steps trained by the attempt that just failed; `starts`: the
    epoch seconds of the restarts so far; `last`: the run's last step."""
    if not fault.recoverable:
        return f"{fault.kind} is not a fault a restart can fix"
    if fault.step > last:
        return f"every step up to {last} was trained before the fault"
    if history and trained_since == 0:
        return (
            f"a crash loop: no new step since the last restart (resumed from step {history[-1][1]},"
            f" {fault.kind} again before step {fault.step} finished)"
        )
    if history and fault.same_as(history[-1][0]):
        return f"a crash loop: the same error twice at step {fault.step} ({fault.kind}: {fault.line})"
    recent = [t for t in starts if now - t < rules.window_s]
    if len(recent) >= rules.limit:
        hours = rules.window_s / 3600
        return (
            f"launch.restarts is {rules.limit} and {len(recent)} restart(s) were made within"
            f" {hours:g} h (launch.restart_window_h)"
            if rules.limit
            else "launch.restarts is 0 (a restart happens only when a recipe or ARGS asks for it)"
        )
    return None


def lost_work(timeline: dict[str, Any], resumed_from: int, last_step: int) -> tuple[int, float]:
    """(steps trained after the checkpoint resumed from, wall seconds since that step finished or, when it
    was not this attempt's, since the attempt started), from run_verl's timeline."""
    steps = {int(k): float(v) for k, v in (timeline.get("steps") or {}).items()}
    since = steps.get(resumed_from, 0.0)
    return max(0, last_step - resumed_from), max(0.0, float(timeline.get("end", 0.0)) - since)


def first_step_after(timeline: dict[str, Any]) -> float | None:
    """Epoch seconds of an attempt's first training step (None when it trained none)."""
    steps = [float(v) for v in (timeline.get("steps") or {}).values()]
    return float(timeline["start"]) + min(steps) if steps else None
