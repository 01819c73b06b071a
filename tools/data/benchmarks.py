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
import re
from dataclasses import dataclass
from pathlib import Path

from tools.atomic import atomic_path
from tools.data.template import build_prompt, instruction
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
    # put back LaTeX backslashes the source's JSON writer lost (`repair_lost_escapes`); only where the file
    # is known to need it: MATH-500's Asymptote code has real tabs before words ("\treturn")
    repair_escapes: bool = False


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
            sha256="af2b8bd2aa911b6333ad0df32f3ca05c7ae8ed10f1731f4372c8ae26990bf7ac",
            count=30,
            id_field="id",
            problem_field="problem",
            answer_field="answer",
        ),
        BenchmarkSpec(
            name="aime25",
            title="AIME 2025 (I and II)",
            file="aime25/test.jsonl",
            sha256="b4e273c02d3e7fe1b74b59eae768fc8230bfb0f79539890cb56f4361caac0331",
            count=30,
            id_field="id",
            problem_field="problem",
            answer_field="answer",
            repair_escapes=True,  # problems 18, 19 and 27: "\frac" read back as a form feed, "\triangle" as a tab
        ),
        BenchmarkSpec(
            name="math500",
            title="MATH-500 (PRM800K test split)",
            file="math500/test.jsonl",
            sha256="35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
            count=500,
            id_field="unique_id",
            problem_field="problem",
            answer_field="answer",
        ),
    )
}


# A LaTeX command whose backslash a JSON writer took for an escape: "\\frac" written as "\frac" reads back as a
# form feed then "rac", "\\triangle" as a tab then "riangle" (the AIME 2025 file has both). In a file that
# has no Asymptote code with real tabs, a control character followed by a letter is never meant.
_LOST_ESCAPES = {"\x08": "\\b", "\x0c": "\\f", "\t": "\\t", "\r": "\\r"}
_LOST_ESCAPE = re.compile("[\x08\x0c\t\r](?=[A-Za-z])")


def repair_lost_escapes(text: str) -> str:
    """The text with each control character that stands for a lost LaTeX backslash turned back into one."""
    return _LOST_ESCAPE.sub(lambda m: _LOST_ESCAPES[m.group(0)], text)


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
    """The problems of a shipped benchmark, in file order, checksum checked; ids are unique strings.

    The problem text is the file's, with lost LaTeX escapes repaired where the spec says so; ids and
    answers are the file's, as strings (AIME 2024's "025" stays "025": the grader takes it as 25)."""
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
        problem = repair_lost_escapes(values[1]) if spec.repair_escapes else values[1]
        problems.append(BenchmarkProblem(values[0], problem, values[2]))
    if len(problems) != spec.count:
        raise BenchmarkError(f"{path}: {len(problems)} problems, expected {spec.count}")
    if len({p.id for p in problems}) != len(problems):
        raise BenchmarkError(f"{path}: the ids in field {spec.id_field!r} are not unique")
    return problems


def benchmark_rows(name: str, style: str = "system", template: str = "r1-zero") -> list[dict]:
    """verl's RL rows of a benchmark: the recipe's prompt template, data_source = the benchmark's name,
    reward_model.ground_truth = the reference answer, extra_info.index = the problem's position."""
    text = instruction(template)
    return [
        {
            "data_source": name,
            "prompt": build_prompt(p.problem, style, text),
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": p.answer},
            "extra_info": {"split": "test", "index": i, "source_row": i + 1},
        }
        for i, p in enumerate(load_benchmark(name))
    ]


def write_benchmark_parquet(name: str, dst: Path, style: str = "system", template: str = "r1-zero") -> Path:
    """dst/<name>.parquet in verl's schema (written atomically); its path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tools.data.schema import SCHEMA  # pyarrow: only when a parquet is written

    dst.mkdir(parents=True, exist_ok=True)
    out = dst / f"{name}.parquet"
    table = pa.Table.from_pylist(benchmark_rows(name, style, template), schema=SCHEMA)
    with atomic_path(out) as tmp:
        pq.write_table(table, tmp)
    return out


def write_benchmarks(
    dst: Path, names: list[str] | None = None, style: str = "system", template: str = "r1-zero"
) -> list[Path]:
    """Every named benchmark (default: all of BENCHMARKS) as dst/<name>.parquet."""
    return [write_benchmark_parquet(n, dst, style, template) for n in (names or list(BENCHMARKS))]
