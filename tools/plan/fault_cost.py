"""What a fault costs, and how often to save (`make plan`'s "faults and checkpoints" section).

Inputs: the model's parameter count (the planner's Arch), the world size, the planner's step time, and three
recipe keys with stated defaults:
  launch.storage_gbps   the checkpoint storage's aggregate write and read bandwidth, GB/s (DEFAULT_STORAGE_GBPS)
  launch.mtbf_hours     the mean time between failures of the whole job (DEFAULT_MTBF_HOURS per device, divided
                        by the world size, when the recipe leaves it out)
  launch.startup_s      the start-up of a restarted run before its checkpoint loads: Ray, the workers, the
                        rollout engine (DEFAULT_STARTUP_S)

A checkpoint of verl's Megatron actor holds the bf16 weights and the distributed optimizer's fp32 main
parameters and two Adam moments: CHECKPOINT_BYTES_PER_PARAM = 2 + 4 + 4 + 4 bytes a parameter, each shard
written once (per rank: total / world). Then (Young 1974, Daly 2006):

    save_s    = checkpoint bytes / storage bandwidth
    restart_s = the watchdog's fail_grace_s + startup_s + checkpoint bytes / storage bandwidth (the load)
    interval  = sqrt(2 x save_s x MTBF)                    the save interval that minimises the expected loss
    save_freq = max(1, round(interval / step_s))
    lost per failure = save_freq x step_s / 2 + restart_s   (half an interval of work, on average, plus the restart)
    overhead  = save_s / (save_freq x step_s) + lost per failure / MTBF   (the fraction of the run lost to both)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tools.errors import UserError
from tools.launch import watchdog

CHECKPOINT_BYTES_PER_PARAM = 2 + 4 + 4 + 4  # bf16 weights; fp32 main params, exp_avg, exp_avg_sq
DEFAULT_STORAGE_GBPS = 10.0  # a shared parallel file system's aggregate rate for one job; set yours
# Meta's Llama 3 paper (2024, section 3.3.4): 419 unexpected interruptions in 54 days on 16,384 GPUs, one per
# about 50,700 GPU-hours; per device, for lack of a published Ascend figure
DEFAULT_MTBF_DEVICE_HOURS = 54 * 24 * 16384 / 419
DEFAULT_STARTUP_S = 600.0


@dataclass(frozen=True)
class FaultCost:
    checkpoint_bytes: int
    per_rank_bytes: int
    save_s: float
    restart_s: float
    mtbf_h: float
    mtbf_given: bool
    step_s: float
    save_freq: int
    lost_per_failure_s: float
    overhead: float


def _positive(launch: Any, key: str, default: float | None) -> float | None:
    value = launch.get(key, default) if launch is not None else default
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise UserError(
            f"launch.{key}: {value!r}", fix=f"a number > 0 (ARGS='launch.{key}=...'); see {__name__}"
        )
    return float(value)


def price(params: int, world: int, step_s: float, launch: Any, fail_grace_s: float) -> FaultCost:
    """The figures above for a model of `params` parameters on `world` ranks at `step_s` a step."""
    gbps = _positive(launch, "storage_gbps", DEFAULT_STORAGE_GBPS)
    given = _positive(launch, "mtbf_hours", None)
    mtbf_h = given if given is not None else DEFAULT_MTBF_DEVICE_HOURS / max(world, 1)
    startup = _positive(launch, "startup_s", DEFAULT_STARTUP_S)
    size = params * CHECKPOINT_BYTES_PER_PARAM
    save_s = size / (gbps * 1e9)
    restart_s = fail_grace_s + startup + save_s
    mtbf_s = mtbf_h * 3600
    interval = math.sqrt(2 * save_s * mtbf_s)
    freq = max(1, round(interval / step_s))
    lost = freq * step_s / 2 + restart_s
    overhead = save_s / (freq * step_s) + lost / mtbf_s
    return FaultCost(size, size // max(world, 1), save_s, restart_s, mtbf_h, given is not None, step_s, freq,
                     lost, overhead)  # fmt: skip


def lines(c: FaultCost, save_freq: Any, keep: Any) -> list[str]:
    """The plan's section; `save_freq` and `keep`: the recipe's verl.trainer.save_freq, max_actor_ckpt_to_keep."""
    mtbf = f"{c.mtbf_h:.1f} h" + (
        " (launch.mtbf_hours)"
        if c.mtbf_given
        else f" (default: {DEFAULT_MTBF_DEVICE_HOURS:.0f} device-hours / world)"
    )
    out = [
        "faults and checkpoints (tools/plan/fault_cost.py; Young/Daly):",
        f"  checkpoint {c.checkpoint_bytes / 1e12:.2f} TB ({CHECKPOINT_BYTES_PER_PARAM} B a parameter: weights +"
        f" optimizer), {c.per_rank_bytes / 2**30:.1f} GiB per rank",
        f"  save {c.save_s:.0f} s; restart {c.restart_s:.0f} s (detection + start-up + load); MTBF {mtbf}",
        f"  best save_freq {c.save_freq} (every {c.save_freq * c.step_s / 60:.0f} min at {c.step_s:.0f} s a step):"
        f" {c.lost_per_failure_s / 60:.0f} min of work lost per failure, {100 * c.overhead:.1f}% of the run lost"
        " to saves and failures",
    ]
    if save_freq is not None and int(save_freq) != c.save_freq:
        note = (
            "no checkpoint: a failure loses the whole run"
            if int(save_freq) <= 0
            else f"save_freq {save_freq}"
        )
        out.append(f"  the recipe: {note} (verl.trainer.save_freq; keep {keep})")
    return out


def section(cfg: Any, arch: Any, step_s: float | None) -> list[str]:
    """The plan's section for a composed recipe ([] without a model or a step time)."""
    from omegaconf import OmegaConf

    from tools.plan.params import total_params  # omegaconf, yaml: only when a plan is made

    if arch is None or not step_s:
        return []
    launch = cfg.launch
    c = price(total_params(arch), int(launch.world_size), step_s, launch, watchdog.settings(launch)[1])
    trainer = OmegaConf.select(cfg, "verl.trainer", default={}) or {}
    return lines(c, trainer.get("save_freq"), trainer.get("max_actor_ckpt_to_keep"))
