"""A reward function that never answers: verl's `custom_reward_function` for the fault test of a reward
worker that hangs (tests/current/test_faults_e2e.py). The first call writes the time to
ASCEND_R1_FAULT_MARK, then every call sleeps for an hour."""

from __future__ import annotations

import os
import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    mark = os.environ.get("ASCEND_R1_FAULT_MARK")
    if mark:
        with open(mark, "a") as f:
            f.write(f"{time.time()} {os.getpid()}\n")
    time.sleep(3600)
    return {"score": 0.0}
