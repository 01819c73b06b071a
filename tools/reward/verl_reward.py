"""verl `custom_reward_function` entry points. verl imports this file by path, so it puts the
repository root on sys.path itself and needs nothing else from the caller.

    custom_reward_function.path=tools/reward/verl_reward.py
    custom_reward_function.name=compute_score            # deepscaler: 0.33 format + 0.67 answer
                               compute_score_accuracy    # 1 for a correct boxed answer
                               compute_score_strict      # 1 only for right format and right answer
    custom_reward_function.name=compute_score_long_addition   # tools/tasks/long_addition.py: 1 for the
                               # right sum, whatever the format; `trace` says which format was used
    custom_reward_function.name=compute_score_long_addition_blind   # the no-pay control: any closed answer
    # with reward_model.reward_manager=batch (scores the whole batch over processes):
    custom_reward_function.name=compute_score_batch
    custom_reward_function.reward_kwargs: {mode: deepscaler, workers: 2, time_limit: 5.0, batch_time_limit: 120.0,
                                           think_prefilled: false}

time_limit bounds one answer's grading, batch_time_limit one call's (a training step's batch), and for
compute_score, which verl calls a response at a time, step_time_limit bounds one step's grading in this
process (tools/reward/pool.py: calls less than 2 s of idle grader apart are one step):
    custom_reward_function.reward_kwargs: {time_limit: 5.0, step_time_limit: 120.0}
Answers cut off by any of them score as wrong, and each result's "timeout" is 1.0 for them (verl collects it into
reward_extra_info: validation logs its mean as val-aux/<source>/timeout/mean@N).

Each math result carries `pred`, the answer's vote (tools/reward/vote.py: the grader's normal form, "" for
no answer): verl 0.9.1's validation then logs maj@N (val-core/<source>/acc/maj@N/mean, cons@N) beside
mean@N (pass@1); verl 0.6.0 computes maj@N from `pred` alike. Training ignores it.

Signature (verl 0.6.0, naive reward manager):
    compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict with "score"
and for the batch manager:
    compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos, **kwargs) -> list[dict]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tools.reward.pool import GradePool  # noqa: E402
from tools.reward.score import score_responses  # noqa: E402
from tools.reward.tally import record  # noqa: E402
from tools.tasks import long_addition  # noqa: E402

_POOLS: dict[tuple[int | None, float, float | None, float | None], GradePool] = {}
# seconds for one step's grading (a batch's, or a step's responses one call each), whatever the policy writes
BATCH_TIME_LIMIT = STEP_TIME_LIMIT = 120.0


def _seconds(value: float | None) -> float | None:
    return None if value is None else float(value)


def _pool(
    workers: int | None,
    time_limit: float,
    batch_time_limit: float | None = None,
    step_time_limit: float | None = None,
) -> GradePool:
    """One pool (and so one cache, and one step budget) per setting, kept for the life of the process."""
    key = (workers, float(time_limit), _seconds(batch_time_limit), _seconds(step_time_limit))
    if key not in _POOLS:
        _POOLS[key] = GradePool(
            workers=workers, time_limit=key[1], batch_time_limit=key[2], step_time_limit=key[3]
        )
    return _POOLS[key]


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    mode: str = "deepscaler",
    workers: int | None = 1,
    time_limit: float = 5.0,
    think_prefilled: bool = False,
    step_time_limit: float | None = STEP_TIME_LIMIT,
    **kwargs: Any,
) -> dict[str, float | str]:
    t = time.perf_counter()
    pool = _pool(workers, time_limit, step_time_limit=step_time_limit)
    results = score_responses([solution_str], [ground_truth], pool, mode, think_prefilled, with_pred=True)
    # the parts of the reward per training step, which verl does not log (tools/reward/tally.py)
    record(results, [extra_info], time.perf_counter() - t)
    return results[0]


def compute_score_accuracy(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> dict[str, float]:
    kwargs["mode"] = "accuracy"
    return compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)


def compute_score_strict(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> dict[str, float]:
    kwargs["mode"] = "strict"
    return compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)


def compute_score_long_addition(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> dict[str, float]:
    """R1-Zero in miniature's reward (recipes/tiny-zero.yaml, launch.reward): correctness only, scored by the
    task module the base model was pre-trained from; `trace` (0/1) reaches verl's reward_extra_info, so
    validation logs val-aux/addition-<n>d/trace/mean@N."""
    return _long_addition(solution_str, ground_truth, extra_info, blind=False)


def compute_score_long_addition_blind(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **kwargs: Any
) -> dict[str, float]:
    """The no-pay control of R1-Zero in miniature (`launch.reward=compute_score_long_addition_blind`, make
    bench-zero's no-pay run): 1 for any closed answer, right or wrong, which both formats earn alike, so
    nothing the trace does pays. `acc` and `trace` are as compute_score_long_addition's: validation still
    measures correctness."""
    return _long_addition(solution_str, ground_truth, extra_info, blind=True)


def _long_addition(
    solution_str: str, ground_truth: Any, extra_info: dict | None, blind: bool
) -> dict[str, float]:
    t = time.perf_counter()
    result = long_addition.score(solution_str, ground_truth)
    if blind:
        result["score"] = float(long_addition.closed(solution_str))
    record([result], [extra_info], time.perf_counter() - t)
    return result


def compute_score_batch(
    data_sources: Any,
    solution_strs: list[str],
    ground_truths: list[Any],
    extra_infos: Any = None,
    mode: str = "deepscaler",
    workers: int | None = None,
    time_limit: float = 5.0,
    think_prefilled: bool = False,
    batch_time_limit: float | None = BATCH_TIME_LIMIT,
    **kwargs: Any,
) -> list[dict[str, float]]:
    t = time.perf_counter()
    results = score_responses(
        list(solution_strs),
        list(ground_truths),
        _pool(workers, time_limit, batch_time_limit),
        mode,
        think_prefilled,
        with_pred=True,
    )
    record(results, extra_infos, time.perf_counter() - t)
    return results
