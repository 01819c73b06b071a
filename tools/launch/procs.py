"""Stopping process trees: SIGTERM, a grace period, then SIGKILL for whatever is left; or at once (freeze,
then kill) where nothing may write another file."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
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


def freeze_and_kill(find: Callable[[], list[Any]], rounds: int = 5) -> list[Any]:
    """Stop a run's processes at once, before any of them writes another file: SIGSTOP each process that
    `find()` returns, and again for any that appeared meanwhile (a process can start a child until it is
    frozen), then SIGKILL them all and wait for them to go. The processes it stopped."""
    import psutil

    frozen: dict[int, Any] = {}
    for _ in range(rounds):
        new = [p for p in find() if p.pid not in frozen and not gone(p)]
        if not new:
            break
        for p in new:
            with contextlib.suppress(psutil.Error):
                p.suspend()
                frozen[p.pid] = p
    for p in frozen.values():
        with contextlib.suppress(psutil.Error):
            p.kill()
    _wait(list(frozen.values()), 10)
    return list(frozen.values())
