"""Reading a run: verl's metrics, make train's records, the reward tally, the run folder's files.

Input (what verl writes with `trainer.logger=[console,file]`): verl's `file` logger backend
(verl/utils/tracking.py FileLogger) appends one JSON object per `Tracking.log` call to
`$VERL_FILE_LOGGER_PATH` (or `$VERL_FILE_LOGGER_ROOT/<project>/<experiment>.jsonl`):

    {"step": 27, "data": {"timing_s/step": 1338.3, "timing_s/gen": ..., "prompt_length/mean": ..., ...}}

A training step has `timing_s/step`; validation-only records (before training) do not. `make train`'s
merged `metrics.jsonl` ({"step", "kind", "attempt", "metrics"}) is read too. In a run folder the report
takes metrics.jsonl if present (with the verl-metrics-<attempt>.jsonl of a live attempt, one it does not
have yet), else every verl-metrics-*.jsonl (later attempts win a step), else any *.jsonl in the file-logger
format. A half-written last line (a live run) is skipped.

Beside them: config.yaml and command.txt (what ran), timeline.json (attempts, wall time, peak memory),
checkpoints/, base_model.json and final_eval.json (tools/analysis/learning.py), and reward-tally-<attempt>
.jsonl (the reward's format / accuracy / timeouts per training step, tools/reward/tally.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.errors import UserError
from tools.records import read_json, read_jsonl
from tools.reward import tally


class ReportError(UserError):
    pass


@dataclass
class Devices:
    ranks: float | None  # world size of the run
    dies_per_device: int = 1
    unit: str = "device"

    @property
    def devices(self) -> float | None:
        return self.ranks / self.dies_per_device if self.ranks else None


@dataclass
class Run:
    """Everything the report reads of one run."""

    path: Path  # as given: a run folder or a metrics file
    folder: Path
    label: str
    steps: dict[int, dict[str, Any]]  # training step -> metrics (verl's, the tally's under reward/*)
    validations: dict[int, dict[str, Any]]  # step -> the val-* metrics of a validation
    records: list[dict[str, Any]]  # every record as {"step", "data"} (learning.curve reads them)
    sources: list[Path]
    config: Any = None  # OmegaConf of config.yaml, None without one
    timeline: dict[str, Any] = field(default_factory=dict)  # timeline.json: attempt -> what it measured
    dev: Devices = field(default_factory=lambda: Devices(ranks=None))
    tally_steps: int = 0  # training steps with the reward tally


def _read_records(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(step, metrics) from a verl file-logger JSONL or make train's metrics.jsonl; skips a torn last line."""
    out = []
    lines = path.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):  # a live run is writing it
                continue
            raise ReportError(
                f"{path}:{i}: not JSON ({e})", fix="is this a verl metrics JSONL file?"
            ) from None
        if not isinstance(rec, dict) or "step" not in rec:
            raise ReportError(
                f"{path}:{i}: a record without 'step'",
                fix='expected verl\'s file logger lines {"step": N, "data": {...}}',
            )
        if rec.get("kind") == "restart":  # a restart of make train (tools/launch/restart_records.py)
            continue
        data = rec.get("data", rec.get("metrics"))
        if not isinstance(data, dict):
            raise ReportError(f"{path}:{i}: no 'data' (verl file logger) or 'metrics' (make train) object")
        out.append((int(rec["step"]), data))
    return out


_jsonl = read_jsonl  # a torn last line skipped (tools/records.py)


def _attempt(p: Path) -> int:
    tail = p.stem.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def find_metrics(run: Path) -> list[Path]:
    if run.is_file():
        return [run]
    if not run.is_dir():
        raise ReportError(
            f"{run}: no such run folder or metrics file",
            fix="pass RUN=<outputs/<stack>/<run>> or RUN=<verl metrics .jsonl>",
        )
    attempts = sorted(run.glob("verl-metrics-*.jsonl"), key=_attempt)
    if (run / "metrics.jsonl").is_file():
        # make train merges an attempt's metrics when it ends: an attempt after those is a live one
        done = [r.get("attempt", 0) for r in _jsonl(run / "metrics.jsonl")]
        return [run / "metrics.jsonl", *[p for p in attempts if _attempt(p) > max(done, default=0)]]
    if attempts:
        return attempts
    found = sorted(
        p
        for p in run.rglob("*.jsonl")
        if "report" not in p.parts
        and not p.name.startswith((tally.PREFIX, "activity-"))  # tools/launch/activity.py's CPU samples
        and p.name != "steps.jsonl"
    )
    if not found:
        raise ReportError(
            f"{run}: no metrics JSONL found",
            fix="run verl with trainer.logger=[console,file] (make train does) and point RUN= at "
            "the run folder or at $VERL_FILE_LOGGER_PATH",
        )
    return found


def is_train(data: dict[str, Any]) -> bool:
    return "timing_s/step" in data or "perf/time_per_step" in data


def devices_of(cfg: Any) -> Devices:
    """World size and report unit from the run's composed recipe (config.yaml) when there is one."""
    launch = cfg.get("launch", {}) if cfg is not None else {}
    if launch and launch.get("nodes") is not None:
        return Devices(
            ranks=float(launch.nodes) * float(launch.devices_per_node),
            dies_per_device=int(launch.get("dies_per_device", 1) or 1),
            unit=str(launch.get("device_unit", "device") or "device"),
        )
    return Devices(ranks=None)


_json = read_json  # tools/records.py


def responses_per_step(cfg: Any) -> int:
    """Training responses scored in a step: (gen_)batch x rollout.n (0 when the config does not say)."""
    from omegaconf import OmegaConf

    if cfg is None:
        return 0
    batch = OmegaConf.select(cfg, "verl.data.gen_batch_size", default=None) or OmegaConf.select(
        cfg, "verl.data.train_batch_size", default=None
    )
    n = OmegaConf.select(cfg, "verl.actor_rollout_ref.rollout.n", default=1)
    try:
        return int(batch) * int(n or 1)
    except (TypeError, ValueError):
        return 0


def read_tally(folder: Path, cfg: Any, steps: dict[int, dict[str, Any]]) -> dict[int, dict[str, float]]:
    """step -> reward/* from the reward-tally-<attempt>.jsonl files; an attempt's first step is the
    first training step of its verl-metrics-<attempt>.jsonl (timeline.json's resume point without one)."""
    per_step = responses_per_step(cfg)
    files = sorted(folder.glob(f"{tally.PREFIX}*.jsonl"), key=_attempt)
    if not files or not per_step:
        return {}
    timeline = _json(folder / "timeline.json") or {}
    out: dict[int, dict[str, float]] = {}
    for f in files:
        attempt = _attempt(f)
        metrics = folder / f"verl-metrics-{attempt}.jsonl"
        first = None
        if metrics.is_file():
            trained = [s for s, d in _read_records(metrics) if is_train(d)]
            first = min(trained) if trained else None
        if first is None:
            resumed = (timeline.get(str(attempt)) or {}).get("resumed_from_step")
            first = int(resumed) + 1 if resumed is not None else None
        if first is None:
            continue
        out.update(tally.per_step(tally.read(f), per_step, first))
    return {s: m for s, m in out.items() if s in steps}


def read(path: Path | str, label: str | None = None) -> Run:
    """The run at `path` (a run folder or a metrics file), read once."""
    path = Path(path)
    sources = find_metrics(path)
    steps: dict[int, dict[str, Any]] = {}
    validations: dict[int, dict[str, Any]] = {}
    records: list[dict[str, Any]] = []
    for src in sources:
        for step, data in _read_records(src):
            records.append({"step": step, "data": data})
            val = {k: v for k, v in data.items() if k.startswith("val-")}
            if val:
                validations[step] = {**validations.get(step, {}), **val}
            if is_train(data):
                rest = {k: v for k, v in data.items() if not k.startswith("val-")}
                steps[step] = {**steps.get(step, {}), **rest}
    folder = path if path.is_dir() else path.parent
    cfg = None
    if path.is_dir() and (folder / "config.yaml").is_file():
        from omegaconf import OmegaConf

        cfg = OmegaConf.load(folder / "config.yaml")
    run = Run(
        path=path,
        folder=folder,
        label=label or (folder.name if path.is_dir() else path.stem),
        steps=dict(sorted(steps.items())),
        validations=dict(sorted(validations.items())),
        records=records,
        sources=sources,
        config=cfg,
        timeline=(_json(folder / "timeline.json") or {}) if path.is_dir() else {},
        dev=devices_of(cfg),
    )
    if path.is_dir():
        tallies = read_tally(folder, cfg, run.steps)
        for s, m in tallies.items():
            run.steps[s] = {**m, **run.steps[s]}  # a key verl logs itself wins
        run.tally_steps = len(tallies)
    return run


def labels(paths: list[Path]) -> list[str]:
    """Short distinct names: the folder name, with as many parent folders as it takes to tell apart."""
    parts = [Path(p).resolve().parts for p in paths]
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [str(p) for p in paths]


def get(m: dict[str, Any], *keys: str) -> float | None:
    """The first of `keys` that is a number in `m` (NaN counts as absent)."""
    for k in keys:
        v = m.get(k)
        if isinstance(v, int | float) and not (isinstance(v, float) and math.isnan(v)):
            return float(v)
    return None
