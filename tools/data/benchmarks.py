"""The evaluation benchmarks shipped in the repository (benchmarks/<name>/), read with their checksums checked.

    load_benchmark("aime24") -> [BenchmarkProblem(id="60", problem="Every morning Aya ...", answer="204"), ...]

Each file is kept byte for byte as its public source published it (benchmarks/<name>/README.md: repository,
commit, path, license); BENCHMARKS records its sha256 and the fields that hold the id, the problem and
the reference answer. A file whose bytes differ from the recorded sha256 is refused: a benchmark edited
by hand (or a bad merge) would make every figure computed on it incomparable with the paper's. Nothing is
fetched at run time.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from tools.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS_DIR = REPO_ROOT / "benchmarks"


class BenchmarkError(UserError):
    """An unknown benchmark name, or a benchmark file that is missing, altered or malformed."""


@dataclass(frozen=True)
class BenchmarkSpec:
    name: str  # also the data_source written to the parquet and verl's metric names (val-core/<name>/...)
    title: str
    file: str  # relative to benchmarks/
    sha256: str
    count: int
    id_field: str
    problem_field: str
    answer_field: str


@dataclass(frozen=True)
class BenchmarkProblem:
    id: str
    problem: str
    answer: str


# name -> spec; the sha256 and count are those of the file as fetched (benchmarks/<name>/README.md)
BENCHMARKS: dict[str, BenchmarkSpec] = {
    spec.name: spec
    for spec in (
        BenchmarkSpec(
            name="aime24",
            title="AIME 2024 (I and II)",
            file="aime24/test.jsonl",
            sha256="PENDING",
            count=30,
            id_field="id",
            problem_field="problem",
            answer_field="answer",
        ),
        BenchmarkSpec(
            name="aime25",
            title="AIME 2025 (I and II)",
            file="aime25/test.jsonl",
            sha256="PENDING",
            count=30,
            id_field="id",
            problem_field="problem",
            answer_field="answer",
        ),
        BenchmarkSpec(
            name="math500",
            title="MATH-500 (PRM800K test split)",
            file="math500/test.jsonl",
            sha256="PENDING",
            count=500,
            id_field="unique_id",
            problem_field="problem",
            answer_field="answer",
        ),
    )
}


def benchmark_spec(name: str) -> BenchmarkSpec:
    try:
        return BENCHMARKS[name]
    except KeyError:
        raise BenchmarkError(
            f"unknown benchmark {name!r}",
            fix=f"use one of: {', '.join(BENCHMARKS)} (benchmarks/README.md)",
        ) from None


def benchmark_path(name: str, root: Path = BENCHMARKS_DIR) -> Path:
    return root / benchmark_spec(name).file


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def verify_benchmark(name: str, root: Path = BENCHMARKS_DIR) -> Path:
    """The benchmark's file, after checking that its bytes are those recorded; BenchmarkError otherwise."""
    spec = benchmark_spec(name)
    path = root / spec.file
    if not path.is_file():
        raise BenchmarkError(
            f"{path}: benchmark {name!r} is missing",
            fix="restore it from git: git checkout -- " + str(Path("benchmarks") / spec.file),
        )
    found = sha256_of(path)
    if found != spec.sha256:
        raise BenchmarkError(
            f"{path}: checksum differs (expected sha256 {spec.sha256}, found {found}); figures computed on "
            "an altered benchmark are not comparable with published ones",
            fix=f"restore the file from git (git checkout -- benchmarks/{spec.file}); to ship a new "
            f"version on purpose, record its source in benchmarks/{name}/README.md and its sha256 in "
            "tools/data/benchmarks.py BENCHMARKS",
        )
    return path


def load_benchmark(name: str, root: Path = BENCHMARKS_DIR) -> list[BenchmarkProblem]:
    """The problems of a shipped benchmark, in file order, checksum checked; ids are unique strings."""
    spec = benchmark_spec(name)
    path = verify_benchmark(name, root)
    problems: list[BenchmarkProblem] = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        record = json.loads(line)
        values = []
        for field in (spec.id_field, spec.problem_field, spec.answer_field):
            value = record.get(field)
            if value is None or str(value).strip() == "":
                raise BenchmarkError(f"{path}:{line_no}: field {field!r} is missing or empty")
            values.append(str(value).strip())
        problems.append(BenchmarkProblem(*values))
    if len(problems) != spec.count:
        raise BenchmarkError(f"{path}: {len(problems)} problems, expected {spec.count}")
    if len({p.id for p in problems}) != len(problems):
        raise BenchmarkError(f"{path}: the ids in field {spec.id_field!r} are not unique")
    return problems
