"""Grade many (answer, ground truth) pairs: cache, fast path, then worker processes with a time limit.

Work per call:
1. each pair is looked up in a cache (GRPO samples n responses per prompt, so pairs repeat);
2. `grade_fast` settles, without sympy, the pairs whose verdict is certain (equal after normalisation,
   plain numbers, values that clearly differ);
3. the remaining *distinct* pairs go to worker processes running `grade_full`. Each worker stops
   pure-Python work itself after `time_limit` seconds (SIGALRM); a worker still silent at
   `time_limit + grace` (stuck where signals cannot reach: inside C code) is killed and replaced, and its pair is
   scored wrong with by="timeout". So no single response can hold a training step longer than that;
4. with `batch_time_limit`, one call's slow grading ends by then whatever the answers are: pairs still
   being graded or queued are scored wrong with by="deadline" (and their workers replaced);
5. with `step_time_limit`, the slow grading of one training step is bounded when the reward function is
   called a response at a time (verl's per-response managers): calls that follow one another with less
   than `step_gap` seconds of an idle pool between them are one step, and together they may spend at most
   `step_time_limit` seconds in slow grading; after that the step's remaining pairs are cut off
   ("deadline") at once. The pool is idle between steps (the actor's update, the next generation), so a
   new step starts with the whole budget; when responses arrive while the policy still generates, a pause
   longer than `step_gap` starts the budget afresh, which can only loosen the bound, never cut a pair
   early. Either way a step's grading ends at most `step_time_limit` after its last response arrives.

The workers are forks of one warm fork server, `python -m tools.reward.worker ... zygote`: a fresh
interpreter (safe from a threaded process such as a Ray worker; the parent's __main__ is never
re-imported) that imports and warms up the graders once. A replacement for a killed worker is a fork,
ready in milliseconds. (Before, each replacement was a fresh interpreter, 2-3 s of imports and warm-up
on a quiet machine and ~10 s on a loaded one, during which that worker graded nothing: 16 answers stuck
in C code, 2 workers and a 1 s limit took 45.8 s, and 213 s with `make train` beside it.)

One pool may be called from several threads at once (verl 0.9.1's reward loop runs the reward function in
a thread pool, and tools/reward/verl_reward.py keeps one pool per process): a call holds the pool's lock,
so two calls never share a worker's socket (unlocked, one thread could read the other's answer and the
other then wait for it forever: a training step that never ends).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
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
from tools.reward.worker import PID

_ROOT = str(Path(__file__).resolve().parents[2])

Pair = tuple[str | None, str]


class _Zygote:
    """The fork server (`python -m tools.reward.worker FD SECONDS zygote`) and its control socket."""

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
                "zygote",
            ],
            pass_fds=[child.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        child.close()
        self.sock = parent
        self.ready = False

    def fork(self) -> tuple[int, Connection]:
        """A new worker forked from the warm zygote: (pid, its socket). Waits for the zygote's warm-up once."""
        try:
            if not self.ready:
                if self.sock.recv(1) != b"R":
                    raise EOFError
                self.ready = True
            parent, child = socket.socketpair()
            socket.send_fds(self.sock, [b"F"], [child.fileno()])
            child.close()
            data = b""
            while len(data) < PID.size:
                more = self.sock.recv(PID.size - len(data))
                if not more:
                    raise EOFError
                data += more
        except (EOFError, OSError):
            raise RuntimeError(
                f"the grading fork server `python -m tools.reward.worker` exited with code {self.proc.wait()}: "
                "run `python -m tools.reward.worker 0 1 zygote` by hand to see the import error"
            ) from None
        return PID.unpack(data)[0], Connection(parent.detach())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        try:
            self.proc.wait(1)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class _Worker:
    """One worker process forked by the zygote, and its socket. Signalled through a pidfd where the kernel
    has them (Linux 5.3+: no pid-reuse race, the zygote being its parent), else by pid (older kernels, such
    as the 4.19 of some NPU hosts; the zygote's children are reaped at once, so a dead pid is gone)."""

    def __init__(self, zygote: _Zygote) -> None:
        self.pid, self.conn = zygote.fork()
        try:
            self.pidfd: int | None = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self.pidfd = None
        self.closed = False
        self.gone = False
        self.task: tuple[int, str | None, str] | None = None
        self.started = 0.0
        self.ready = False  # the worker says "ready" once it is forked and listening

    def _alive_by_pid(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def exited(self) -> bool:
        if self.closed:
            return self.gone
        if self.pidfd is None:
            return not self._alive_by_pid()
        return bool(select.select([self.pidfd], [], [], 0)[0])

    def wait_gone(self, timeout: float) -> bool:
        if self.pidfd is not None:
            return bool(select.select([self.pidfd], [], [], timeout)[0])
        end = time.monotonic() + timeout
        while self._alive_by_pid():
            if time.monotonic() > end:
                return False
            time.sleep(0.005)
        return True

    def send_signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
            else:
                os.kill(self.pid, sig)

    def release(self) -> None:
        self.conn.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
        self.closed = True

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
        self.gone = self.wait_gone(5.0)  # gone within milliseconds
        self.release()


class GradePool:
    """Verdicts for (answer, ground_truth) pairs, identical to `grade_full` pair by pair, but faster.

    workers=0 grades in this process (SIGALRM limit only, main thread only): for tests and debugging.
    """

    def __init__(
        self,
        workers: int | None = None,
        time_limit: float = 5.0,
        grace: float = 0.25,
        batch_time_limit: float | None = None,
        step_time_limit: float | None = None,
        step_gap: float = 2.0,
        cache_size: int = 1 << 18,
        use_fast_path: bool = True,
        worker_module: str = "tools.reward.worker",
    ) -> None:
        self.workers = min(4, os.cpu_count() or 1) if workers is None else workers
        self.time_limit = time_limit
        self.grace = grace  # a worker silent at time_limit + grace is killed (stuck in C code)
        self.batch_time_limit = batch_time_limit  # one call's slow grading ends by then: the rest "deadline"
        self.step_time_limit = step_time_limit  # slow grading per step (calls < step_gap apart), module doc
        self.step_gap = step_gap
        self._step_spent = 0.0  # slow-grading seconds of the current step
        self._idle_since: float | None = None  # when the last slow grading ended (None: never graded)
        self.cache_size = cache_size
        self.use_fast_path = use_fast_path
        self.worker_module = worker_module  # a module name or a .py path; tests use one that hangs on purpose
        self.cache: dict[Pair, Verdict] = {}
        self.stats: Counter[str] = Counter()  # how each pair was settled: cache, fast_*, pool, timeout, ...
        self.max_task_seconds = 0.0  # slowest single grading in a worker, seconds
        self._pool: list[_Worker] = []
        self._zygote: _Zygote | None = None
        self._lock = threading.Lock()  # one call at a time: the workers' sockets are not shared (module doc)

    # -- life cycle --------------------------------------------------------------------------------
    def _new_worker(self) -> _Worker:
        if self._zygote is not None and self._zygote.proc.poll() is not None:
            self._zygote.close()  # died (out of memory?): start another
            self._zygote = None
        if self._zygote is None:
            self._zygote = _Zygote(self.time_limit, self.worker_module)
        return _Worker(self._zygote)

    def _ensure_workers(self, n: int) -> None:
        while len(self._pool) < n:
            self._pool.append(self._new_worker())

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
            if not w.wait_gone(1.0):
                w.send_signal(signal.SIGKILL)
            w.release()
        self._pool.clear()
        if self._zygote is not None:
            self._zygote.close()
            self._zygote = None

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

    def _deadline(self, start: float) -> float | None:
        """When this call's slow grading must end: the batch limit, and what is left of the step's."""
        ends = [] if self.batch_time_limit is None else [start + self.batch_time_limit]
        if self.step_time_limit is not None:
            if self._idle_since is None or start - self._idle_since > self.step_gap:
                self._step_spent = 0.0  # the pool was idle for longer than step_gap: a new step
            ends.append(start + max(0.0, self.step_time_limit - self._step_spent))
        return min(ends) if ends else None

    def _grade_slow(self, pairs: list[Pair]) -> list[Verdict]:
        if not pairs:
            return []
        start = time.perf_counter()
        try:
            return self._grade_slow_by(pairs, self._deadline(start))
        finally:
            end = time.perf_counter()
            self._step_spent += end - start
            self._idle_since = end

    def _grade_slow_by(self, pairs: list[Pair], deadline: float | None) -> list[Verdict]:
        if deadline is not None and deadline <= time.perf_counter():  # the step's time is spent already
            return [Verdict(False, "deadline")] * len(pairs)
        if self.workers <= 0:
            verdicts = []
            for a, g in pairs:
                t = time.perf_counter()
                left_s = None if deadline is None else deadline - t
                if left_s is not None and left_s <= 0:
                    verdicts.append(Verdict(False, "deadline"))
                    continue
                limit = self.time_limit if left_s is None else min(self.time_limit or left_s, left_s)
                v = grade_timed(a, g, limit)
                if v.by == "timeout" and limit != self.time_limit:
                    v = Verdict(False, "deadline")
                verdicts.append(v)
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
            ends = [w.started + hard for w in busy] if hard is not None else []
            if deadline is not None:
                ends.append(deadline)
            timeout = max(0.0, min(ends) - time.perf_counter()) if ends else None
            for conn in wait(list(waiting), timeout):
                w = waiting[conn]  # type: ignore[index]
                try:
                    msg = w.conn.recv()
                except (EOFError, OSError):  # died (out of memory, ...): its pair is wrong, replace it
                    if w.task is None:
                        raise RuntimeError(
                            "a grading worker forked by `python -m tools.reward.worker` exited before it was "
                            "ready: run `python -m tools.reward.worker 0 1` by hand to see the error"
                        ) from None
                    msg = (w.task[0], False, "crash")
                    w.task = None
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
            if left and deadline is not None and now >= deadline:
                # the batch's time is up: what is still graded or queued is cut off (wrong, "deadline")
                for w in list(self._pool):
                    if w.task is not None:
                        results[w.task[0]] = Verdict(False, "deadline")
                        self._replace(w)
                while queue:
                    results[queue.popleft()[0]] = Verdict(False, "deadline")
                left = 0
        return results  # type: ignore[return-value]

    def _replace(self, w: _Worker) -> None:
        w.kill()
        self._pool[self._pool.index(w)] = self._new_worker()
