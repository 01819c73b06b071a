"""Fault injection for the end-to-end fault tests (tests/current/test_faults_e2e.py), loaded by every
Python process of a run whose PYTHONPATH starts with this folder (Ray passes the environment on).

ASCEND_R1_FAULT=load_weights: vLLM's DeepSeek model raises in `load_weights` from the
ASCEND_R1_FAULT_CALL-th call on (default 1; the engine starts on dummy weights, so the first call is verl's
first weight hand-over), as a kernel that cannot take the weights does. The exception names the time it was
raised (ASCEND_R1_FAULT_MARK is also written with it), so that the test can time the launcher's exit.

ASCEND_R1_FAULT=stop:<moment> (tests/current/test_stop_e2e.py): in the moment's function of verl's V1
trainer (verl.trainer.ppo.v1.trainer_base.PPOTrainer, in the TaskRunnerV1 actor), from its
ASCEND_R1_FAULT_CALL-th call on (default 1), the process appends "<time> <pid> <moment>" to
ASCEND_R1_FAULT_MARK and holds there ASCEND_R1_FAULT_HOLD_S s (default 10) before going on, so that the
moment is in progress when the test stops `make train`:
- validation: on entering _validate;
- generation: once _submit_batch_to_rollout has handed the step's prompts to the agent loop (vLLM generates);
- update: on entering _update_actor;
- save: in _save_checkpoint, once the actor's checkpoint is written, before verl's data.pt and tracker file
  (a save in flight);
- sync: separate_async's weight sync, in the sending actor's process: on entering a bucket's broadcast of the
  project's gloo engine (tools.verl_plugins.gloo_engine), the rollout's receivers waiting in the collective (a sync
  in flight). Each sync of the tiny models is one bucket: call 1 is verl's sync at start, call n that after
  step n - 1.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time

TARGET = "vllm.model_executor.models.deepseek_v2"
TRAINER = "verl.trainer.ppo.v1.trainer_base"
ENGINE = "tools.verl_plugins.gloo_engine"


def _mark(what: str = "") -> float:
    now = time.time()
    mark = os.environ.get("ASCEND_R1_FAULT_MARK")
    if mark:
        with open(mark, "a") as f:
            f.write(f"{now} {os.getpid()} {what}".rstrip() + "\n")
            f.flush()
            os.fsync(f.fileno())
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


def _hold(moment: str, count: list[int]) -> None:
    """The stop fault's hook: from the ASCEND_R1_FAULT_CALL-th call on, mark and hold."""
    count[0] += 1
    if count[0] >= int(os.environ.get("ASCEND_R1_FAULT_CALL", "1")):
        _mark(moment)
        time.sleep(float(os.environ.get("ASCEND_R1_FAULT_HOLD_S", "10")))


def _hold_in(cls, name: str, moment: str, after: bool = False) -> None:
    """cls.name holds on entering (or, `after`, once the real method has returned)."""
    real, count = getattr(cls, name), [0]

    def held(self, *args, **kwargs):
        if not after:
            _hold(moment, count)
            return real(self, *args, **kwargs)
        result = real(self, *args, **kwargs)
        _hold(moment, count)
        return result

    setattr(cls, name, held)


def _hold_in_save(cls) -> None:
    """_save_checkpoint, held once the actor's checkpoint is written (its files on disk, verl's data.pt and
    tracker file not yet)."""
    real, count = cls._save_checkpoint, [0]

    def _save_checkpoint(self):
        wg = self.actor_rollout_wg
        save = wg.save_checkpoint

        def save_then_hold(*args, **kwargs):
            result = save(*args, **kwargs)
            _hold("save", count)
            return result

        wg.save_checkpoint = save_then_hold
        try:
            return real(self)
        finally:
            wg.save_checkpoint = save

    cls._save_checkpoint = _save_checkpoint


def _stop_at(moment: str):
    def hook(module) -> None:
        trainer = module.PPOTrainer
        if moment == "validation":
            _hold_in(trainer, "_validate", moment)
        elif moment == "generation":
            _hold_in(trainer, "_submit_batch_to_rollout", moment, after=True)
        elif moment == "update":
            _hold_in(trainer, "_update_actor", moment)
        elif moment == "save":
            _hold_in_save(trainer)
        else:
            raise ValueError(f"ASCEND_R1_FAULT=stop:{moment}: no such moment")

    return hook


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `hook(module)` right after `target` is imported (the import itself is the normal one)."""

    def __init__(self, hook, target: str = TARGET):
        self.hook, self.target = hook, target

    def find_spec(self, name, path, target=None):
        if name != self.target:
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


_FAULT = os.environ.get("ASCEND_R1_FAULT", "")
if _FAULT == "load_weights":
    sys.meta_path.insert(0, _AfterImport(_break_load_weights))
elif _FAULT == "stop:sync":
    sys.meta_path.insert(
        0,
        _AfterImport(
            lambda module: _hold_in(module.GlooCheckpointEngine, "_broadcast_bucket", "sync"), ENGINE
        ),
    )
elif _FAULT.startswith("stop:"):
    sys.meta_path.insert(0, _AfterImport(_stop_at(_FAULT.split(":", 1)[1]), TRAINER))
