"""Stopping process trees: SIGTERM, a grace period, then SIGKILL for whatever is left."""

from __future__ import annotations

import contextlib
from typing import Any


def terminate(procs: list[Any], grace: float) -> list[Any]:
    """Terminate `procs` (psutil.Process), wait up to `grace` s, kill the rest; returns those killed."""
    import psutil

    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=5)
    return alive
