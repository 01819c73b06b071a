"""What verl's driver prints, read by `make train`: the per-step metrics line, the start-up milestones, and
the step table printed from them (the published NPU run's columns)."""

from __future__ import annotations

import re

from tools.launch.report import generation_and_reshard

# The per-step table in the columns of the published NPU run: (header, verl metric, format)
# gen and reshard: tools.launch.report.generation_and_reshard (the engine's generation; the weights handed
# from the actor to the rollout engine), from what the stack's verl logs.
COLUMNS: list[tuple[str, str, str]] = [
    ("step", "step", "{:>4d}"),
    ("gen s", "gen", "{:>7.2f}"),
    ("reshard s", "reshard", "{:>9.2f}"),
    ("reward s", "timing_s/reward", "{:>8.2f}"),
    ("old_lp s", "timing_s/old_log_prob", "{:>8.2f}"),
    ("ref s", "timing_s/ref", "{:>6.2f}"),
    ("update s", "timing_s/update_actor", "{:>8.2f}"),
    ("step s", "timing_s/step", "{:>7.2f}"),
    ("tok/s/dev", "perf/throughput", "{:>9.1f}"),
    ("prompt", "prompt_length/mean", "{:>7.1f}"),
    ("response", "response_length/mean", "{:>8.1f}"),
    ("reward", "critic/rewards/mean", "{:>7.3f}"),
    ("pg_loss", "actor/pg_loss", "{:>9.2e}"),
    ("kl_loss", "actor/kl_loss", "{:>9.2e}"),
]
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


def derived(data: dict[str, float]) -> dict[str, float]:
    out = dict(data)
    gen, reshard = generation_and_reshard(data)
    if gen is not None:
        out["gen"] = gen
    if reshard is not None:
        out["reshard"] = reshard
    return out


def table_header() -> str:
    widths = [len(f.format(0 if k == "step" else 0.0)) for _, k, f in COLUMNS]
    return " ".join(h.rjust(w) for (h, _, _), w in zip(COLUMNS, widths, strict=True))


def table_row(step: int, data: dict[str, float]) -> str:
    cells = []
    for _, key, fmt in COLUMNS:
        width = len(fmt.format(0 if key == "step" else 0.0))
        value = step if key == "step" else data.get(key)
        cells.append("-".rjust(width) if value is None else fmt.format(value))
    return " ".join(cells)


def is_train_step(data: dict[str, float]) -> bool:
    return "timing_s/step" in data
