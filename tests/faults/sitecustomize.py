"""Fault injection for the end-to-end fault tests (tests/current/test_faults_e2e.py), loaded by every
Python process of a run whose PYTHONPATH starts with this folder (Ray passes the environment on).

ASCEND_R1_FAULT=load_weights: vLLM's DeepSeek model raises in `load_weights` from the
ASCEND_R1_FAULT_CALL-th call on (default 1; the engine starts on dummy weights, so the first call is verl's
first weight hand-over), as a kernel that cannot take the weights does. The exception names the time it was
raised (ASCEND_R1_FAULT_MARK is also written with it), so that the test can time the launcher's exit.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time

TARGET = "vllm.model_executor.models.deepseek_v2"


def _mark() -> float:
    now = time.time()
    mark = os.environ.get("ASCEND_R1_FAULT_MARK")
    if mark:
        with open(mark, "a") as f:
            f.write(f"{now} {os.getpid()}\n")
    return now


def _break_load_weights(module) -> None:
    cls = module.DeepseekV2ForCausalLM
    real = cls.load_weights
    first = int(os.environ.get("ASCEND_R1_FAULT_CALL", "1"))
    calls = [0]

    def load_weights(self, weights):
        calls[0] += 1
        if calls[0] >= first:
            raise RuntimeError(f"injected fault: load_weights raised (at {_mark():.1f})")
        return real(self, weights)

    cls.load_weights = load_weights


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `hook(module)` right after TARGET is imported (the import itself is the normal one)."""

    def __init__(self, hook):
        self.hook = hook

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        real_exec, hook = spec.loader.exec_module, self.hook

        def exec_module(module):
            real_exec(module)
            hook(module)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("ASCEND_R1_FAULT") == "load_weights":
    sys.meta_path.insert(0, _AfterImport(_break_load_weights))
