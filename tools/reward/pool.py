"""Grade many (answer, ground truth) pairs: cache, fast path, then worker processes with a time limit.

Work per call:
1. each pair is looked up in a cache (GRPO samples n responses per prompt, so pairs repeat);
2. `grade_fast` settles, without sympy, the pairs whose verdict is certain (equal after normalisation,
   plain numbers, values that clearly differ);
3. the remaining *distinct* pairs go to worker processes running `grade_full`. Each worker stops
   pure-Python work itself after `time_limit` seconds (SIGALRM); a worker still silent at
   `time_limit + grace` (stuck where signals cannot reach: inside C code) is killed and replaced, and its pair is
   scored wrong with by="timeout". So no single response can hold a training step longer than that.

Workers are fresh interpreters (`python -m tools.reward.worker`), not forks: safe from a threaded
process (a Ray worker), and the parent's __main__ is never re-imported. A replacement takes a second
or two to import and warm up, during which the other workers go on.

One pool may be called from several threads at once (verl 0.9.1's reward loop runs the reward function in
a thread pool, and tools/reward/verl_reward.py keeps one pool per process): a call holds the pool's lock,
so two calls never share a worker's socket (unlocked, one thread could read the other's answer and the
other then wait for it forever: a training step that never ends).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path

from tools.reward.grade import Verdict, grade_fast, grade_timed

_ROOT = str(Path(__file__).resolve().parents[2])

Pair = tuple[str | None, str]


class _Worker:
    """One `python -m tools.reward.worker` process and its socket."""

    def __init__(self, seconds: float | None, module: str) -> None:
        parent, child = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                *([module] if module.endswith(".py") else ["-m", module]),
                str(child.fileno()),
                str(seconds or 0),
            ],
            pass_fds=[child.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        child.close()
        self.conn = Connection(parent.detach())
        self.task: tuple[int, str | None, str] | None = None
        self.started = 0.0
        self.ready = False  # the worker says "ready" once sympy and the graders are imported

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.conn.close()


class GradePool:
    """Verdicts for (answer, ground_truth) pairs, identical to `grade_full` pair by pair, but faster.

    workers=0 grades in this process (SIGALRM limit only, main thread only): for tests and debugging.
    """

    def __init__(
        self,
        workers: int | None = None,
        time_limit: float = 5.0,
        grace: float = 2.0,
        cache_size: int = 1 << 18,
        use_fast_path: bool = True,
        worker_module: str = "tools.reward.worker",
    ) -> None:
        self.workers = min(4, os.cpu_count() or 1) if workers is None else workers
        self.time_limit = time_limit
        self.grace = grace
        self.cache_size = cache_size
        self.use_fast_path = use_fast_path
        self.worker_module = worker_module  # a module name or a .py path; tests use one that hangs on purpose
        self.cache: dict[Pair, Verdict] = {}
        self.stats: Counter[str] = Counter()  # how each pair was settled: cache, fast_*, pool, timeout, ...
        self.max_task_seconds = 0.0  # slowest single grading in a worker, seconds
        self._pool: list[_Worker] = []
        self._lock = threading.Lock()  # one call at a time: the workers' sockets are not shared (module doc)

    # -- life cycle --------------------------------------------------------------------------------
    def _ensure_workers(self, n: int) -> None:
        while len(self._pool) < n:
            self._pool.append(_Worker(self.time_limit, self.worker_module))

    def start(self) -> None:
        """Start the workers now and wait until they have imported the graders (else the first batch does)."""
        with self._lock:
            self._ensure_workers(self.workers)
            for w in self._pool:
                if not w.ready:
                    if w.conn.recv() != "ready":
                        raise RuntimeError("grading worker sent something before 'ready'")
                    w.ready = True

    def close(self) -> None:
        for w in self._pool:
            with contextlib.suppress(OSError):
                w.conn.send(None)
            try:
                w.proc.wait(1)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
            w.conn.close()
        self._pool.clear()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit, modules may be gone already
            self.close()

    def __enter__(self) -> GradePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- grading -----------------------------------------------------------------------------------
    def _remember(self, pair: Pair, v: Verdict) -> None:
        if self.cache_size <= 0:
            return
        if len(self.cache) >= self.cache_size:
            del self.cache[next(iter(self.cache))]  # oldest first
        self.cache[pair] = v

    def grade(self, pairs: Sequence[Pair]) -> list[Verdict]:
        """A verdict for each pair. Safe to call from several threads: one call at a time (module doc)."""
        with self._lock:
            return self._grade(pairs)

    def _grade(self, pairs: Sequence[Pair]) -> list[Verdict]:
        out: list[Verdict | None] = [None] * len(pairs)
        slow: dict[Pair, list[int]] = {}
        for i, pair in enumerate(pairs):
            hit = self.cache.get(pair)
            if hit is not None:
                out[i] = hit
                self.stats["cache"] += 1
                continue
            if pair in slow:
                slow[pair].append(i)
                self.stats["duplicate"] += 1
                continue
            v = grade_fast(*pair) if self.use_fast_path else None
            if v is not None:
                out[i] = v
                self._remember(pair, v)
                self.stats[v.by] += 1
                continue
            slow[pair] = [i]
        verdicts = self._grade_slow(list(slow))
        for pair, v in zip(slow, verdicts, strict=True):
            self._remember(pair, v)
            self.stats[v.by] += 1
            for i in slow[pair]:
                out[i] = v
        return out  # type: ignore[return-value]

    def _grade_slow(self, pairs: list[Pair]) -> list[Verdict]:
        if not pairs:
            return []
        if self.workers <= 0:
            verdicts = []
            for a, g in pairs:
                t = time.perf_counter()
                verdicts.append(grade_timed(a, g, self.time_limit))
                self.max_task_seconds = max(self.max_task_seconds, time.perf_counter() - t)
            return verdicts
        self._ensure_workers(min(self.workers, len(pairs)))
        results: list[Verdict | None] = [None] * len(pairs)
        queue = deque((k, a, g) for k, (a, g) in enumerate(pairs))
        hard = None if self.time_limit is None else self.time_limit + self.grace
        left = len(pairs)
        while left:
            for w in self._pool:
                if w.ready and w.task is None and queue:
                    w.task = queue.popleft()
                    w.started = time.perf_counter()
                    w.conn.send(w.task)
            waiting = {w.conn: w for w in self._pool if not w.ready or w.task is not None}
            busy = [w for w in waiting.values() if w.task is not None]
            timeout = None
            if hard is not None and busy:
                timeout = max(0.0, min(w.started + hard for w in busy) - time.perf_counter())
            for conn in wait(list(waiting), timeout):
                w = waiting[conn]  # type: ignore[index]
                try:
                    msg = w.conn.recv()
                except (EOFError, OSError):  # died (out of memory, ...): its pair is wrong, replace it
                    if w.task is None:
                        raise RuntimeError(
                            f"grading worker `python -m tools.reward.worker` exited with code {w.proc.wait()} "
                            "before it was ready: run it by hand to see the import error"
                        ) from None
                    msg = (w.task[0], False, "crash")
                    self._replace(w)
                if msg == "ready":
                    w.ready = True
                    continue
                key, correct, by = msg
                results[key] = Verdict(correct, by)
                self.max_task_seconds = max(self.max_task_seconds, time.perf_counter() - w.started)
                w.task = None
                left -= 1
            now = time.perf_counter()
            for w in busy:
                if hard is not None and w.task is not None and now - w.started > hard:
                    results[w.task[0]] = Verdict(False, "timeout")
                    self.max_task_seconds = max(self.max_task_seconds, now - w.started)
                    left -= 1
                    self._replace(w)
        return results  # type: ignore[return-value]

    def _replace(self, w: _Worker) -> None:
        w.kill()
        self._pool[self._pool.index(w)] = _Worker(self.time_limit, self.worker_module)
