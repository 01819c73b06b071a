"""A reward function that stalls once, for bench/bench_faults.py's stall case: the first call after the file
named by ASCEND_R1_STALL_TRIGGER appears claims it (renames it to <name>.claimed, so exactly one call in one
process stalls) and sleeps for an hour; every other call, before and after (the restarted run's), is the
project's own reward (tools/reward/verl_reward.py), so the run scores as an unfaulted one. verl imports this
file by path: the repository root goes on sys.path here."""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from tools.reward.verl_reward import compute_score as project_score  # noqa: E402


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    trigger = os.environ.get("ASCEND_R1_STALL_TRIGGER")
    if trigger:
        try:
            os.rename(trigger, trigger + ".claimed")
        except FileNotFoundError:
            pass  # not asked yet, or another call stalls
        else:
            time.sleep(3600)
    return project_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
