"""What verl's driver prints, read by `make train`: the per-step metrics line and the start-up milestones
(the step table printed from them: tools/report/live.py)."""

from __future__ import annotations

import re

# the step table lives with the report (tools/report/live.py); supervise.py reads it from here
from tools.report.live import COLUMNS, derived, is_train_step, table_header, table_row

__all__ = [
    "COLUMNS", "MILESTONES", "STAGES", "STAGE_LINES", "derived", "is_train_step", "parse_console_metrics",
    "table_header", "table_row",
]  # fmt: skip

STEP_LINE = re.compile(r"step:(\d+) - (.*)$")
NUMPY_SCALAR = re.compile(r"np\.(?:float|int|uint)\d*\((.*)\)")
# timeline.json: seconds from the attempt's start to the first log line with each marker (the verl 0.9 ones
# only appear on the current stack: its Megatron workers, then its vLLM servers, start separately)
MILESTONES: list[tuple[str, str]] = [
    ("ray_init", "ray init kwargs"),
    ("ray_up", "(TaskRunner"),
    ("workers_up", "actor and ref model engine initialized"),
    ("rollout_start", "(vLLMHttpServer"),
    ("rollout_up", "checkpoint engine manager initialized"),
    ("training_start", "Training Progress"),
]
# the line printed when a milestone is reached (MILESTONES' keys; {t}: seconds since verl started)
STAGE_LINES = {
    "ray_init": "starting Ray and the verl workers ...",
    "ray_up": "Ray is up ({t:.0f} s); the actor and reference workers are starting",
    "workers_up": "the actor and reference workers are up ({t:.0f} s); the rollout is starting",
    "rollout_start": "the rollout server is starting ({t:.0f} s)",
    "rollout_up": "the rollout is up ({t:.0f} s); validation before training",
    "training_start": "training starts ({t:.0f} s)",
}
# stage shown while nothing else is printed, by the last milestone reached (MILESTONES' keys)
STAGES = {
    None: "starting verl",
    "ray_init": "starting Ray",
    "ray_up": "starting the actor and reference workers",
    "workers_up": "starting the rollout",
    "rollout_start": "starting the rollout server",
    "rollout_up": "validation before training",
    "training_start": "step 1",
}


def parse_console_metrics(line: str) -> tuple[int, dict[str, float]] | None:
    """verl's console logger line `step:N - key:value - ...` -> (N, {key: value})."""
    m = STEP_LINE.search(line.rstrip())
    if not m:
        return None
    data: dict[str, float] = {}
    for part in m.group(2).split(" - "):
        key, sep, value = part.rpartition(":")
        if not sep:
            continue
        numpy_scalar = NUMPY_SCALAR.fullmatch(value.strip())  # verl 0.9 prints numpy 2 reprs: np.float64(0.0)
        try:
            data[key.strip()] = float(numpy_scalar.group(1) if numpy_scalar else value)
        except ValueError:
            continue
    return int(m.group(1)), data
