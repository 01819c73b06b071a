"""The peak memory of a process and everything it starts (the benchmarks' `make train` and asset runs):
its whole process tree sampled with psutil, summed RSS every 0.2 s and summed PSS (which splits a shared
page between its sharers) every 1 s, and the most processes seen at once. PSS is read from
/proc/<pid>/smaps_rollup, which walks each process's page tables: ~140 ms of CPU for the current stack's
`make train` tree (RSS 0.3 ms), so sampling it every 0.2 s took up to 70% of a core from the run being
timed; every 1 s, 14%. The peak it looks for, after the checkpoint save, lasts several seconds.

    with sampled(proc.pid) as peak:
        proc.wait()
    peak["rss"], peak["pss"], peak["procs"]   (bytes, bytes, count)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psutil

RSS_EVERY_S, PSS_EVERY = 0.2, 5  # PSS every 5th sample: every 1 s


def sample_tree(root: int, stop: threading.Event, peak: dict) -> None:
    n = 0
    while not stop.is_set():
        try:
            procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
        except psutil.Error:
            break
        with_pss = n % PSS_EVERY == 0
        rss = pss = 0
        for p in procs:
            try:
                if with_pss:
                    info = p.memory_full_info()
                    pss += getattr(info, "pss", info.rss)
                else:
                    info = p.memory_info()
                rss += info.rss
            except psutil.Error:
                continue
        peak["rss"] = max(peak.get("rss", 0), rss)
        if with_pss:
            peak["pss"] = max(peak.get("pss", 0), pss)
        peak["procs"] = max(peak.get("procs", 0), len(procs))
        n += 1
        stop.wait(RSS_EVERY_S)


@contextmanager
def sampled(root: int) -> Iterator[dict]:
    """Sample the tree of process `root` in a thread while the block runs; the peaks, filled in as it goes."""
    stop, peak = threading.Event(), {}
    th = threading.Thread(target=sample_tree, args=(root, stop, peak), daemon=True)
    th.start()
    try:
        yield peak
    finally:
        stop.set()
        th.join()
