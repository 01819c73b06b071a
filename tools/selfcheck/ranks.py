"""Running one check over several local ranks: a free port, one process per rank, their verdicts."""

from __future__ import annotations

import multiprocessing as mp
import socket
from collections.abc import Callable

from tools.selfcheck.result import CheckFailed


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(target: Callable, world: int, tp: int, *, start_method: str, timeout: float, what: str) -> None:
    """Start `target(rank, world, tp, port, queue)` for every rank; each puts `(rank, {"error"|"wrong"})`.

    Raises CheckFailed naming the ranks that reported an error or wrong groups."""
    port = free_port()
    ctx = mp.get_context(start_method)
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, tp, port, q)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=timeout) for _ in range(world))
    for p in procs:
        p.join(timeout=timeout / 10)
    problems = {
        r: o.get("error") or o["wrong"] for r, o in results.items() if o.get("error") or o.get("wrong")
    }
    if problems:
        raise CheckFailed(f"{what}: {problems}")
