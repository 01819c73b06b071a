"""What `make eval` samples: a shipped benchmark (aime24, aime25, math500: tools/data/benchmarks.py) put in
the recipe's prompt, or a run's own held-out set (`test`: the recipe's test.parquet, as verl validates on it:
tiny-zero's addition-1d .. addition-3d buckets, tiny-learn's 20 sums)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.data.benchmarks import BENCHMARKS, benchmark_path, load_benchmark
from tools.data.template import build_prompt, instruction
from tools.errors import UserError

HELD_OUT = "test"  # BENCH=test: the run's held-out set (launch.paths.data/test.parquet)


@dataclass(frozen=True)
class Problem:
    id: str  # unique within the benchmark
    source: str  # verl's data_source: the benchmark's name, or the held-out bucket (addition-2d)
    messages: list[dict[str, str]]  # the chat messages verl stores in the `prompt` column
    ground_truth: str


@dataclass(frozen=True)
class ProblemSet:
    name: str
    problems: list[Problem]
    file: Path
    sha256: str  # of `file`: a resumed evaluation refuses a data file that changed under it


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def known_benchmarks() -> list[str]:
    """The shipped benchmarks' names."""
    return list(BENCHMARKS)


def held_out(data_dir: Path) -> ProblemSet:
    """The run's test.parquet (verl's RL schema: prompt, data_source, reward_model.ground_truth)."""
    import pyarrow.parquet as pq

    path = data_dir / "test.parquet"
    if not path.is_file():
        raise UserError(
            f"{path}: no held-out set (the recipe's launch.paths.data/test.parquet)",
            fix="make the recipe's data first (`make prepare RECIPE=<recipe>` or its `make train`)",
        )
    rows = pq.read_table(path, columns=["data_source", "prompt", "reward_model", "extra_info"]).to_pylist()
    problems = []
    for i, row in enumerate(rows):
        truth = (row.get("reward_model") or {}).get("ground_truth")
        if truth is None or not row.get("prompt"):
            raise UserError(
                f"{path}: row {i} has no prompt or no reward_model.ground_truth", fix="remake the data"
            )
        index = (row.get("extra_info") or {}).get("index", i)
        problems.append(
            Problem(f"{row['data_source']}/{index}", str(row["data_source"]), list(row["prompt"]), str(truth))
        )
    if len({p.id for p in problems}) != len(problems):
        problems = [
            Problem(f"{p.source}/{i}", p.source, p.messages, p.ground_truth) for i, p in enumerate(problems)
        ]
    return ProblemSet(HELD_OUT, problems, path, sha256_of(path))


def benchmark(name: str, template: str, style: str) -> ProblemSet:
    """A shipped benchmark in the recipe's prompt (tools/data/template.py), checksum checked on loading."""
    rows = load_benchmark(name)  # BenchmarkError (a UserError) for a file whose checksum differs
    text = instruction(template)
    problems = [Problem(p.id, name, build_prompt(p.problem, style, text), p.answer) for p in rows]
    path = benchmark_path(name)
    return ProblemSet(name, problems, path, sha256_of(path))


def check_names(names: list[str]) -> None:
    """Refuse an unknown benchmark before anything is exported or sampled."""
    known = [HELD_OUT, *known_benchmarks()]
    for name in names:
        if name not in known:
            raise UserError(
                f"unknown benchmark {name!r}",
                fix=f"BENCH= one or more (comma-separated) of: {', '.join(known)}",
            )
    if not names:
        raise UserError("BENCH= is empty", fix=f"BENCH= one or more (comma-separated) of: {', '.join(known)}")


def load(name: str, config: Any | None) -> ProblemSet:
    """BENCH=<name>: `test` (the run's held-out set) or a shipped benchmark."""
    from omegaconf import OmegaConf

    if name == HELD_OUT:
        data = OmegaConf.select(config, "launch.paths.data") if config is not None else None
        if not data:
            raise UserError(
                "BENCH=test is a run's held-out set, and there is no run", fix="give RUN=<run folder>"
            )
        return held_out(Path(data))
    names = known_benchmarks()
    if name not in names:
        raise UserError(
            f"unknown benchmark {name!r}",
            fix=f"BENCH= one or more (comma-separated) of: {', '.join([HELD_OUT, *names])}",
        )
    template = (OmegaConf.select(config, "launch.task.template") if config is not None else None) or "r1-zero"
    style = (OmegaConf.select(config, "launch.task.style") if config is not None else None) or "system"
    return benchmark(name, template, style)
