"""The peak memory of a process and everything it starts (the benchmarks' `make train` and asset runs):
its whole process tree sampled every 0.2 s with psutil, summed RSS and summed PSS (which counts pages
shared by forked processes once), and the most processes seen at once.

    with sampled(proc.pid) as peak:
        proc.wait()
    peak["rss"], peak["pss"], peak["procs"]   (bytes, bytes, count)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psutil


def sample_tree(root: int, stop: threading.Event, peak: dict) -> None:
    while not stop.is_set():
        try:
            procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
        except psutil.Error:
            break
        rss = pss = 0
        for p in procs:
            try:
                info = p.memory_full_info()
                rss += info.rss
                pss += getattr(info, "pss", info.rss)
            except psutil.Error:
                continue
        peak["rss"] = max(peak.get("rss", 0), rss)
        peak["pss"] = max(peak.get("pss", 0), pss)
        peak["procs"] = max(peak.get("procs", 0), len(procs))
        stop.wait(0.2)


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
