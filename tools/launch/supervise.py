"""Running verl under `make train`: start it in a session of its own, stream its output to the run's
verl.log, print the step table and a progress line at least every TICK_S s, watch for failures and stalls
(tools/launch/watchdog.py), and stop every process of the run at once on Ctrl-C, SIGTERM or a watchdog
verdict."""

from __future__ import annotations

import contextlib
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from tools.launch import watchdog
from tools.launch.activity import Activity
from tools.launch.console import (
    MILESTONES,
    STAGE_LINES,
    STAGES,
    derived,
    is_train_step,
    parse_console_metrics,
    table_header,
    table_row,
)
from tools.launch.process_tree import ProcessTree

REPO = Path(__file__).resolve().parents[2]


class Stop(Exception):
    """Ctrl-C or SIGTERM reached the launcher."""


class _OnSignal:
    """SIGINT and SIGTERM while verl runs: the first raises Stop. Any later one (a second Ctrl-C, a
    scheduler's SIGTERM after the user's Ctrl-C) only counts: raised inside the stop, it would cut short the
    freezing of the run's processes (a process not yet frozen would go on writing, one frozen would never
    be killed) and the records the launcher writes after it. The handler stays after a stop, until the
    launcher exits."""

    def __init__(self) -> None:
        self.first: str | None = None
        self.more = 0

    def __call__(self, signum, frame):
        if self.first is None:
            self.first = signal.Signals(signum).name
            raise Stop(self.first)
        self.more += 1


RAY_START_TRIES = 5
RAY_START_TIMEOUT = "The current node timed out during startup"


def ray_start_timed_out(log_path: Path) -> bool:
    """Whether the last attempt in verl.log ended with Ray's node start-up timeout (and nothing else ran)."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    last = text.rsplit("\n==== attempt ", 1)[-1]
    return RAY_START_TIMEOUT in last


TICK_S = 15.0  # a progress line at least this often while a stage lasts
EXIT_FAILED = 3  # verl stopped by the watchdog (run_verl's exit status)


def run_verl(
    argv: list[str],
    env: dict[str, str],
    run: Path,
    attempt: int,
    out: TextIO,
    watch_s: tuple[float, float] = (600.0, 30.0),
) -> tuple[int, list[tuple[int, dict[str, float]]], dict[str, Any]]:
    """Start verl, stream its log to run/verl.log, print a row per step and a progress line at least every
    TICK_S s; returns (exit status, step records, timeline). Ctrl-C/SIGTERM, or a failure or stall that
    the watchdog sees (`watch_s`: stall_s, fail_grace_s): every process of the run is frozen and killed
    at once (nothing writes another file); a watchdog stop returns EXIT_FAILED with timeline["failure"].
    After a Ctrl-C/SIGTERM, further ones are ignored until the launcher exits (_OnSignal)."""
    log_path = run / "verl.log"
    timeline: dict[str, Any] = {"start": time.time()}
    records: list[tuple[int, dict[str, float]]] = []
    cmd = [sys.executable, *argv]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
        start_new_session=True,  # Ctrl-C in the terminal reaches the launcher only; it stops verl in order
    )  # fmt: skip
    tree = ProcessTree(proc.pid)
    done = threading.Event()
    lines: queue.Queue[str | None] = queue.Queue()

    def sampler() -> None:
        while not done.is_set():
            tree.sample()
            done.wait(0.5)

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    sampling = threading.Thread(target=sampler, daemon=True)
    sampling.start()
    busy = Activity(tree, run / f"activity-{attempt}.jsonl").start()  # when rollout and trainer computed
    threading.Thread(target=reader, daemon=True).start()
    printed_header = False
    on_signal = _OnSignal()
    old_int = signal.signal(signal.SIGINT, on_signal)
    old_term = signal.signal(signal.SIGTERM, on_signal)
    stopped, failure, killed = None, None, []
    clock = time.monotonic
    watch = watchdog.Watch(*watch_s, start=clock())
    stage, stage_since, last_out, step = None, clock(), clock(), 0
    try:
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"\n==== attempt {attempt}: {' '.join(cmd)}\n")
            while True:
                try:
                    line = lines.get(timeout=1.0)
                except queue.Empty:
                    line = ""
                    if proc.poll() is not None:  # verl exited; a process it left may hold its output open
                        break
                if line is None:  # verl's output ended: it exited
                    break
                now = clock()
                if line:
                    log.write(line)
                    watch.line(line, now)
                    t = time.time() - timeline["start"]
                    for key, marker in MILESTONES:
                        if marker in line and key not in timeline:
                            timeline[key] = t
                            stage, stage_since, last_out = key, now, now
                            watch.progress(now)
                            out.write(STAGE_LINES[key].format(t=t) + "\n")
                    parsed = parse_console_metrics(line)
                    if parsed is not None:
                        step, data = parsed
                        records.append((step, data))
                        watch.progress(now)
                        if is_train_step(data):
                            timeline.setdefault("steps", {})[str(step)] = t
                            if not printed_header:
                                out.write(table_header() + "\n")
                                printed_header = True
                            out.write(table_row(step, derived(data)) + "\n")
                            stage, stage_since, last_out = f"step {step + 1}", now, now
                        vals = {  # the means (verl also logs std, best@k, worst@k of each: in metrics.jsonl)
                            k.split("/")[-2] + "/" + k.split("/")[-1]: v
                            for k, v in data.items()
                            if k.startswith("val-") and not re.search(r"/(std|best|worst|maj)", k)
                        }
                        if vals:
                            timeline.setdefault("validations", {})[str(step)] = t
                            shown = ", ".join(f"{k} {v:.3f}" for k, v in sorted(vals.items()))
                            out.write(f"validation at step {step}: {shown}\n")
                            last_out = now
                if now - last_out >= TICK_S:
                    what = STAGES.get(stage, stage)
                    out.write(f"  ... {what} ({now - stage_since:.0f} s; verl.log {log.tell() >> 10} KiB)\n")
                    last_out = now
                out.flush()
                failure = watch.verdict(now)
                if failure is not None:
                    log.flush()
                    break
        if failure is not None:
            timeline["failure"] = failure.__dict__
            out.write(_failure_lines(failure, run, attempt, watch_s[0]))
            if failure.kind == "stalled":
                dumped = watchdog.dump_stacks(tree.members(), run / f"stacks-{attempt}")
                out.write(
                    f"where each process was (py-spy): {run / f'stacks-{attempt}'} ({len(dumped)} processes)\n"
                )
            out.write("stopping verl and Ray ...\n")
            out.flush()
            killed = tree.kill_now()
            rc = EXIT_FAILED
        else:
            rc = proc.wait()
    except Stop as e:
        stopped = str(e)
        out.write(f"\n{stopped}: stopping verl and Ray ...\n")
        out.flush()
        killed = tree.kill_now()  # frozen, then killed: no step, metric or checkpoint is written after this
        rc = 130 if stopped == "SIGINT" else 143
    finally:
        if on_signal.first is None:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)
        done.set()
        sampling.join(timeout=10)  # no sample in flight while the run is stopped (process_tree.stop)
        busy.stop()
        killed += tree.stop()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    timeline["end"] = time.time() - timeline["start"]
    timeline["peak_rss_tree_bytes"] = tree.peak_rss
    timeline["peak_rss_by_process"] = [[n, r] for n, r in tree.peak_breakdown]
    timeline["left_running_and_stopped"] = killed
    timeline["exit"] = rc
    first = watch.exception or watch.failure
    if first is not None:  # the first error any process reported, also when verl exited by itself
        timeline["first_error"] = {"process": first[0], "line": first[1]}
    if on_signal.more:
        out.write(f"({on_signal.more} more stop signal(s) while stopping: the stop was already under way)\n")
    if stopped or failure is not None:
        out.write(f"stopped: no verl or Ray process left ({len(killed)} stopped)\n")
    return rc, records, timeline


def _failure_lines(f: watchdog.Failure, run: Path, attempt: int, stall_s: float) -> str:
    log = run / "verl.log"
    if f.kind == "failed":
        return (
            f"\n{f.process} failed and the run did not recover within {f.seconds:.0f} s:\n"
            f"  {f.first_error}\n  the whole log: {log} (attempt {attempt})\n"
        )
    earlier = f"; the last error, from {f.process}: {f.first_error}" if f.first_error else ""
    return (
        f"\nno step, validation or log line for {f.seconds:.0f} s (launch.watchdog.stall_s {stall_s:.0f}):"
        f" the run stalled{earlier}\n  the whole log: {log} (attempt {attempt})\n"
    )
