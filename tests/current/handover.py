"""TEST-ONLY Ray worker setup hook for tests/current/test_weights_reach_the_engine.py.

Ray runs `install()` in every worker process of the run (runtime_env.worker_process_setup_hook). It
changes nothing in what verl computes: when verl's trainer module is imported (in the TaskRunner), its
`compute_data_metrics` is wrapped to add three figures per step, from tensors verl already has in the batch:

    handover/actor_max_abs, handover/actor_mean_abs
        |vLLM's log-prob - the Megatron actor's log-prob| of each sampled response token, both on the
        weights of this step (vLLM generated after verl handed the actor's weights over; the actor's
        `old_log_probs` are computed before the update);
    handover/ref_mean_abs
        the same against the reference model, i.e. the weights before any hand-over of a trained actor.

They reach metrics.jsonl through verl's own file logger.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

TARGET = "verl.trainer.ppo.ray_trainer"


def _figures(batch) -> dict[str, float]:
    b = batch.batch
    if "rollout_log_probs" not in b.keys() or "old_log_probs" not in b.keys():  # noqa: SIM118  (a TensorDict)
        return {}
    mask = b["response_mask"].bool()
    rollout = b["rollout_log_probs"].float()[mask]
    out = {}
    actor = (rollout - b["old_log_probs"].float()[mask]).abs()
    out["handover/actor_max_abs"] = actor.max().item()
    out["handover/actor_mean_abs"] = actor.mean().item()
    if "ref_log_prob" in b.keys():  # noqa: SIM118  (a TensorDict)
        out["handover/ref_mean_abs"] = (rollout - b["ref_log_prob"].float()[mask]).abs().mean().item()
    out["handover/tokens"] = float(mask.sum().item())
    return out


def _patch(module) -> None:
    original = module.compute_data_metrics

    def compute_data_metrics(batch, *args, **kwargs):
        metrics = original(batch, *args, **kwargs)
        metrics.update(_figures(batch))
        return metrics

    module.compute_data_metrics = compute_data_metrics


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def install() -> None:
    if TARGET in sys.modules:
        _patch(sys.modules[TARGET])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
