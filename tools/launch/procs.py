"""Stopping process trees: SIGTERM, a grace period, then SIGKILL for whatever is left."""

from __future__ import annotations

import contextlib
import time
from typing import Any


def gone(p: Any) -> bool:
    """`p` (psutil.Process) has exited: no such process, or a zombie (exited, its parent has not reaped it:
    waiting for it here would wait for that parent)."""
    import psutil

    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait(procs: list[Any], timeout: float) -> list[Any]:
    """Wait up to `timeout` s for `procs` to be gone(); those still alive."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if not gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if not gone(p)]
    return alive


def terminate(procs: list[Any], grace: float) -> list[Any]:
    """Terminate `procs` (psutil.Process), wait up to `grace` s, kill the rest; returns those killed."""
    import psutil

    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    alive = _wait(procs, grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    _wait(alive, 5)
    return alive
