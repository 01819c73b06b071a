"""What `make train` watches while verl runs, so that no failure and no stall can hang a run.

verl's driver prints every process's output (Ray forwards each worker's lines with a `(Name pid=N)`
prefix). A run is:
- failed when a fatal line came from some process (a Python exception ending a traceback, a vLLM or Ray
  ERROR record, Ray's word that an actor or worker died) and the run neither ended nor made progress
  within `fail_grace_s`: verl 0.9's trainer can wait for ever on an actor that died or on a call that
  raised in another process;
- stalled when no step, validation or start-up stage finished within `stall_s` and no line came either
  (or no progress at all within PROGRESS_FACTOR x `stall_s`, however chatty the processes are).
Either way the launcher dumps where each process was (py-spy) into the run folder, stops every process of
the run and exits non-zero, naming the process, its first error line and the log to read.

The settings are `launch.watchdog` (recipes/hardware/*.yaml: proportionate to the hardware's step).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.errors import UserError

# Ray's prefix of a forwarded line: "(TaskRunner pid=123)", "(WorkerDict pid=5, ip=10.0.0.1)", "(raylet)"
RAY_PREFIX = re.compile(r"^\((?P<name>[^\s()]+)(?: pid=(?P<pid>\d+))?(?:, ip=[^)]*)?\)\s?")
# a log record's header: vLLM's "ERROR 11-26 20:20:10 [core.py:1617] ", verl's "[WARNING] ", Python's
# "WARNING:name:"; what follows it is the record's text
RECORD = re.compile(
    r"^\[?(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b\]?"
    r"(?:\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\])?[\s:]*"
)
FATAL_LEVELS = ("ERROR", "CRITICAL", "FATAL")
# the last line of a traceback: "AssertionError: ...", "ray.exceptions.RayTaskError(ValueError): ..."
EXCEPTION = re.compile(
    r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)\b(?:\([^)]*\))?(?::|$)"
)
# Ray's own words for a process that is gone
RAY_DEATH = re.compile(
    r"A worker died or was killed|ActorDiedError|RayActorError|WorkerCrashedError|"
    r"The actor died|actor died unexpectedly|EngineDeadError|died unexpectedly"
)
PROGRESS_FACTOR = 4
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # Ray colours its prefixes on a terminal and in pipes alike


@dataclass
class Failure:
    kind: str  # "failed" or "stalled"
    process: str  # who: Ray's actor name and pid, or "verl's driver"
    first_error: str  # the first fatal line, without Ray's prefix
    seconds: float  # how long the run had been failing or quiet when it was stopped


def split_prefix(line: str) -> tuple[str, str]:
    """(process, text): Ray's `(Name pid=N)` prefix as "Name pid=N", or "verl's driver". Nested prefixes
    (a vLLM worker's own `(Worker_TP1 pid=M)` inside its server actor's) name the innermost process."""
    text, names = ANSI.sub("", line.rstrip("\n")), []
    while m := RAY_PREFIX.match(text):
        names.append(m.group("name") + (f" pid={m.group('pid')}" if m.group("pid") else ""))
        text = text[m.end() :]
    return (" / ".join(names) if names else "verl's driver"), text


def read_record(text: str) -> tuple[str | None, str]:
    """(level or None, the text after a log record's header)."""
    m = RECORD.match(text)
    return (m.group("level"), text[m.end() :]) if m else (None, text)


@dataclass
class Watch:
    """Decides from verl's output lines (and the clock) when a run has failed or stalled."""

    stall_s: float
    fail_grace_s: float
    start: float
    last_line: float = 0.0
    last_progress: float = 0.0
    failure_at: float | None = None
    failure: tuple[str, str] | None = None  # (process, first fatal line)
    exception: tuple[str, str] | None = None  # (process, the first exception line since the failure began)
    _traceback: set[str] = field(default_factory=set)  # processes inside a traceback

    def __post_init__(self) -> None:
        self.last_line = self.last_progress = self.start

    def line(self, line: str, now: float) -> None:
        """A fatal line: the exception line that ends a traceback, an ERROR/CRITICAL record, or Ray's word
        that a process died. DEBUG/INFO/WARNING records never are, tracebacks they print included."""
        self.last_line = now
        who, text = split_prefix(line)
        level, body = read_record(text)
        if level is not None and level not in FATAL_LEVELS:
            return
        body = body.strip()
        if body.startswith("Traceback (most recent call last)"):
            self._traceback.add(who)
            if level is None:
                return
        exception = bool(RAY_DEATH.search(body)) or (who in self._traceback and bool(EXCEPTION.match(body)))
        if exception:
            self._traceback.discard(who)
        if not exception and level is None:
            return
        if self.failure is None:
            self.failure, self.failure_at = (who, body), now
        if exception and self.exception is None:
            self.exception = (who, body)

    def progress(self, now: float) -> None:
        """A step, a validation or a start-up stage finished: whatever failed before did not stop the run."""
        self.last_progress = now
        self.failure = self.failure_at = self.exception = None

    def verdict(self, now: float) -> Failure | None:
        if (
            self.failure is not None
            and self.failure_at is not None
            and now - self.failure_at >= self.fail_grace_s
        ):
            return Failure("failed", *(self.exception or self.failure), now - self.failure_at)
        quiet = now - max(self.last_line, self.last_progress)
        idle = now - self.last_progress
        if quiet >= self.stall_s or idle >= PROGRESS_FACTOR * self.stall_s:
            who, text = self.exception or self.failure or ("", "")
            return Failure("stalled", who, text, min(quiet, idle) if quiet >= self.stall_s else idle)
        return None


def settings(launch: Any) -> tuple[float, float]:
    """(stall_s, fail_grace_s) from a recipe's `launch.watchdog` (with the defaults for a key left out)."""
    w = (launch.get("watchdog") if launch is not None else None) or {}
    stall, grace = float(w.get("stall_s", 600)), float(w.get("fail_grace_s", 30))
    if stall <= 0 or grace < 0:
        raise UserError(
            f"launch.watchdog: stall_s {stall} and fail_grace_s {grace}",
            fix="stall_s must be > 0 s and fail_grace_s >= 0 s (recipes/hardware/<group>.yaml)",
        )
    return stall, grace


def dump_stacks(procs: list[Any], folder: Path, timeout: float = 20.0) -> list[Path]:
    """py-spy's stack dump of each Python process of `procs` (psutil processes) into `folder`; the files
    written. Processes that are not Python, or that py-spy cannot read, get a file saying so."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for p in procs:
        with contextlib.suppress(Exception):
            name = re.sub(r"[^\w.-]+", "_", " ".join(p.cmdline()[:3]))[:60] or p.name()
            path = folder / f"{p.pid}-{name}.txt"
            if spy is None:
                path.write_text("py-spy is not installed in this environment\n")
            else:
                r = subprocess.run(
                    [spy, "dump", "--pid", str(p.pid)], capture_output=True, text=True, timeout=timeout
                )
                path.write_text(r.stdout + r.stderr)
            written.append(path)
    return written
