"""When the rollout and the trainer actually computed: CPU time of their processes, sampled every 0.1 s.

verl's timing metrics (`timing_s/gen`, `/old_log_prob`, `/update_actor`, ...) say how long the trainer's
driver spent in each phase, not whether the rollout engine generated at the same time: in `separate_async`
it generates in other processes while the trainer trains, in `colocate_async` it is aborted and slept
during training, and both only show as a shorter `timing_s/gen` wait. So `make train` also records, per
sample, the CPU seconds each role's processes used (from /proc through psutil), in
`<run>/activity-<attempt>.jsonl`:

    {"t": <unix time>, "dt": 0.1, "rollout": <CPU s in dt>, "trainer": <CPU s in dt>}

Roles by Ray's process titles (which carry the actor's class): the rollout is vLLM's engine core and
verl's vLLM server (`VLLM::EngineCore`, `ray::vLLMHttpServer`), the trainer is the Megatron actor and
reference workers (`ray::WorkerDict`, `ray::DetachActorWorker` in separate_async). A role is busy in a
sample when it used at least BUSY_CORES of a core (tools/report/overlap.py). Reading the CPU times
of ~20 processes costs well under a millisecond a sample.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from tools.launch.process_tree import ProcessTree, describe

EVERY_S = 0.1
REFRESH_S = 1.0  # how often the process list (and each process's role) is read again
ROLES: dict[str, tuple[str, ...]] = {
    "rollout": ("VLLM::", "ray::vLLMHttpServer", "ray::vLLMReplica"),
    "trainer": ("ray::WorkerDict", "ray::DetachActorWorker", "ray::ActorRolloutRefWorker"),
}


def role_of(title: str) -> str | None:
    for role, prefixes in ROLES.items():
        if title.startswith(prefixes):
            return role
    return None


class Activity:
    """A thread that appends a row of per-role CPU seconds to `path` every `every_s` while the run lives."""

    def __init__(self, tree: ProcessTree, path: Path, every_s: float = EVERY_S) -> None:
        self.tree, self.path, self.every_s = tree, path, every_s
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self._procs: dict[int, tuple[Any, str]] = {}  # pid -> (process, role)
        self._last: dict[int, float] = {}  # pid -> CPU seconds at the last sample

    def start(self) -> Activity:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=5)

    def _refresh(self) -> None:
        try:
            root = psutil.Process(self.tree.root)
            procs = root.children(recursive=True)
        except psutil.Error:
            return
        for p in procs:
            if p.pid in self._procs:
                continue
            with contextlib.suppress(psutil.Error):
                role = role_of(describe(p))
                if role:
                    self._procs[p.pid] = (p, role)

    def _sample(self) -> dict[str, float]:
        used = dict.fromkeys(ROLES, 0.0)
        for pid, (p, role) in list(self._procs.items()):
            try:
                t = p.cpu_times()
            except psutil.Error:
                self._procs.pop(pid, None)
                self._last.pop(pid, None)
                continue
            cpu = t.user + t.system
            if pid in self._last:
                used[role] += max(0.0, cpu - self._last[pid])
            self._last[pid] = cpu
        return used

    def _loop(self) -> None:
        refreshed = 0.0
        last_t = time.time()
        with open(self.path, "a", encoding="utf-8") as f:
            while not self.done.wait(self.every_s):
                now = time.time()
                if now - refreshed >= REFRESH_S:
                    self._refresh()
                    refreshed = now
                used = self._sample()
                f.write(json.dumps({"t": round(now, 3), "dt": round(now - last_t, 3), **used}) + "\n")
                last_t = now
