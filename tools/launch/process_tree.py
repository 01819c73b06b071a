"""The process tree of a run: a root process and everything it starts (verl's driver, Ray's GCS, raylet and
workers, vLLM, checkpoint writers), sampled with psutil. One sampler for `make train` (its peak memory and
the processes it must stop: tools/launch/supervise.py) and the benchmarks (bench/bench_train.py,
bench/bench_learn.py).

RSS is summed every sample; PSS (which splits a shared page between its sharers) only on request. PSS is
read from /proc/<pid>/smaps_rollup, which walks each process's page tables: ~140 ms of CPU for the current
stack's `make train` tree (RSS 0.3 ms), so sampling it every 0.2 s took up to 70% of a core from the run
being timed; every 1 s (PSS_EVERY), 14%. The peak it looks for, after the checkpoint save, lasts seconds.

    with sampled(proc.pid) as peak:
        proc.wait()
    peak["rss"], peak["pss"], peak["procs"]   (bytes, bytes, count)
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil

from tools.launch.procs import freeze_and_kill, gone, terminate

RSS_EVERY_S, PSS_EVERY = 0.2, 5  # the benchmarks: PSS every 5th sample, every 1 s


@dataclass
class ProcessTree:
    """Every process the root started, as seen while it ran, and the peaks of its memory."""

    root: int
    seen: dict[int, float] = field(default_factory=dict)  # pid -> create_time
    peak_rss: int = 0
    peak_pss: int = 0  # 0 until a sample with pss=True
    peak_procs: int = 0  # the most processes at once
    peak_breakdown: list[tuple[str, int]] = field(default_factory=list)  # (process, rss) at the RSS peak

    def __post_init__(self) -> None:
        # the sampler thread adds to `seen` while the launcher's thread may read it (alive, stop)
        self._lock = threading.RLock()

    def sample(self, pss: bool = False) -> bool:
        """One sample of the tree (with PSS when `pss`); False when the root is gone."""
        with self._lock:
            return self._sample(pss)

    def _sample(self, pss: bool) -> bool:
        try:
            root = psutil.Process(self.root)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return False
        rss = pss_sum = 0
        parts: list[tuple[Any, int]] = []
        for p in procs:
            with contextlib.suppress(psutil.Error):
                self.seen.setdefault(p.pid, p.create_time())
                info = p.memory_full_info() if pss else p.memory_info()
                rss += info.rss
                pss_sum += getattr(info, "pss", info.rss)
                parts.append((p, info.rss))
        self.peak_procs = max(self.peak_procs, len(procs))
        if pss:
            self.peak_pss = max(self.peak_pss, pss_sum)
        if rss > self.peak_rss:
            self.peak_rss = rss
            self.peak_breakdown = sorted(_named(parts), key=lambda x: -x[1])
        return True

    def alive(self) -> list[Any]:
        with self._lock:
            seen = list(self.seen.items())
        out = []
        for pid, created in seen:
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
        return out

    def stop(self, grace: float = 20.0, rounds: int = 10) -> list[int]:
        """SIGTERM then SIGKILL whatever of the run still runs, until none is left; the pids it stopped.

        Every round takes every member of the run (members(): those sampled, the root's descendants, and
        whatever else is in the root's session), not only those the sampler happened to see: when verl's
        driver exits on its own (a worker died), Ray's processes lose their parent and leave the tree, and
        while they are being stopped Ray starts more (a raylet replaces dead workers, vLLM's server starts
        its engine): a process started after the last sample was never seen. The rounds go on until a scan
        finds nothing alive (at most `rounds`), so `make train` returns only once every process is gone."""
        self.sample()
        stopped: dict[int, Any] = {}
        for _ in range(rounds):
            procs = [p for p in self.members() if not gone(p)]
            if not procs:
                break
            terminate(procs, grace)
            stopped.update((p.pid, p) for p in procs)
            grace = min(grace, 2.0)  # later rounds: stragglers Ray started while the first stopped
        return list(stopped)

    def members(self) -> list[Any]:
        """Every live process of the run: those seen, the root's descendants now, and whatever else is in
        the root's session (verl starts in a session of its own; a process whose parent exited leaves the
        tree but not the session)."""
        procs = {p.pid: p for p in self.alive()}
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.root)
            procs.update({p.pid: p for p in [root, *root.children(recursive=True)]})
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if p.pid not in procs and os.getsid(p.pid) == self.root:
                    procs[p.pid] = p
        return list(procs.values())

    def kill_now(self) -> list[int]:
        """Freeze every process of the run, then kill them (procs.freeze_and_kill): nothing of the run
        writes another file after this. The pids it stopped."""
        return [p.pid for p in freeze_and_kill(self.members)]


def _named(parts: list[tuple[Any, int]]) -> list[tuple[str, int]]:
    out = []
    for p, rss in parts:
        with contextlib.suppress(psutil.Error):
            out.append((describe(p), rss))
    return out


def describe(p: Any) -> str:
    """A short name for a process of the tree: Ray's process title, or the program and module."""
    try:
        cmd = p.cmdline()
    except Exception:
        return p.name()
    if cmd and cmd[0].startswith("ray::"):
        return cmd[0].split()[0]
    name = os.path.basename(cmd[0]) if cmd else p.name()
    if "-m" in cmd[:3]:
        name += " -m " + cmd[cmd.index("-m") + 1]
    elif len(cmd) > 1:
        name += " " + os.path.basename(cmd[1])
    return name


@contextlib.contextmanager
def sampled(root: int, every_s: float = RSS_EVERY_S, pss_every: int = PSS_EVERY) -> Iterator[dict]:
    """Sample the tree of process `root` in a thread while the block runs (PSS every `pss_every`th
    sample); the peaks, filled in as it goes: {"rss", "pss", "procs"}."""
    tree, stop, peak = ProcessTree(root), threading.Event(), {}

    def loop() -> None:
        n = 0
        while not stop.is_set() and tree.sample(pss=n % pss_every == 0):
            peak.update(rss=tree.peak_rss, procs=tree.peak_procs, pss=tree.peak_pss)
            n += 1
            stop.wait(every_s)

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    try:
        yield peak
    finally:
        stop.set()
        th.join()
