"""`make eval ... SHARD=i/n`: one engine a node, data-parallel over nodes (docs/evaluation.md, "make eval").

Node i of n samples every problem whose index in the benchmark (after --limit) is i mod n and writes its
responses to its own file in the shared eval folder, responses-shard-<i>-of-<n>.jsonl (whole problems,
atomically, resumed as responses.jsonl is), and its settings to settings-shard-<i>-of-<n>.json. The summary is
made from every response file of the folder (the shards' and any unsharded responses.jsonl) once every
problem has its K responses: by the last shard to finish, or by `make eval ... SUMMARY=1`. A problem with
responses in two files is refused, not counted twice.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.errors import UserError

RESPONSES = "responses.jsonl"
SHARD_FILE = re.compile(r"^responses-shard-(\d+)-of-(\d+)\.jsonl$")
SHARD_SETTINGS = re.compile(r"^settings-shard-(\d+)-of-(\d+)\.json$")
# where SHARD=auto reads a node's place: (index variable, count variable)
AUTO_SOURCES = (("SLURM_NODEID", "SLURM_NNODES"), ("RANK", "WORLD_SIZE"))
SHARD_FIX = "SHARD=i/n with 0 <= i < n (node i of n, counted from 0: SHARD=0/4 .. SHARD=3/4), or SHARD=auto"


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def responses(self) -> str:
        return f"responses-shard-{self.index}-of-{self.count}.jsonl"

    @property
    def settings(self) -> str:
        return f"settings-shard-{self.index}-of-{self.count}.json"

    def owns(self, problem_index: int) -> bool:
        return problem_index % self.count == self.index


def parse_shard(text: str, env: Mapping[str, str] | None = None) -> Shard:
    """'i/n' -> Shard(i, n); 'auto' -> from SLURM_NODEID/SLURM_NNODES, else RANK/WORLD_SIZE."""
    env = os.environ if env is None else env
    text = text.strip()
    if text == "auto":
        for index_var, count_var in AUTO_SOURCES:
            if index_var in env and count_var in env:
                return _checked(env[index_var], env[count_var], f"SHARD=auto ({index_var}, {count_var})")
        names = ", ".join(f"{i}/{c}" for i, c in AUTO_SOURCES)
        raise UserError(
            f"SHARD=auto: none of {names} is set in this environment",
            fix="run it under srun (SLURM) or a launcher that sets RANK and WORLD_SIZE, or give " + SHARD_FIX,
        )
    index, sep, count = text.partition("/")
    if not sep:
        raise UserError(f"SHARD={text}: not i/n", fix=SHARD_FIX)
    return _checked(index, count, f"SHARD={text}")


def _checked(index: str, count: str, said: str) -> Shard:
    if not (index.strip().isdigit() and count.strip().isdigit()):
        raise UserError(f"{said}: the node's index and count must be whole numbers", fix=SHARD_FIX)
    i, n = int(index), int(count)
    if n < 1:
        raise UserError(f"{said}: {n} shards; at least 1 is needed", fix=SHARD_FIX)
    if i >= n:
        raise UserError(f"{said}: shard {i} of {n} does not exist (they are 0 .. {n - 1})", fix=SHARD_FIX)
    return Shard(i, n)


def response_files(folder: Path) -> list[Path]:
    """responses.jsonl (if any), then the shards' files in (count, index) order."""
    shards = sorted(
        (tuple(map(int, m.groups())), p)
        for p in folder.glob("responses-shard-*.jsonl")
        if (m := SHARD_FILE.match(p.name))
    )
    plain = [folder / RESPONSES] if (folder / RESPONSES).is_file() else []
    return plain + [p for (_, _), p in sorted(shards, key=lambda t: (t[0][1], t[0][0]))]


def shard_counts(folder: Path) -> set[int]:
    return {
        int(m.group(2))
        for p in folder.iterdir()
        if (m := SHARD_FILE.match(p.name) or SHARD_SETTINGS.match(p.name))
    }


def check_shard_settings(folder: Path, settings: Mapping[str, Any]) -> None:
    """Refuse a folder where a shard sampled with other settings than `settings`."""
    for path in sorted(folder.glob("settings-shard-*.json")):
        old = json.loads(path.read_text())
        changed = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        if changed:
            shown = "; ".join(f"{k}: {old.get(k)!r} there, {settings.get(k)!r} here" for k in changed)
            raise UserError(
                f"{path}: a shard of {folder} sampled with other settings ({shown})",
                fix="give every shard the same RUN/MODEL, BENCH, K and ARGS, or OUT=<another folder>",
            )


def merged_records(
    folder: Path, records_by_file: Mapping[Path, Sequence[Mapping[str, Any]]], order: Mapping[str, int]
) -> list[Mapping[str, Any]]:
    """Every response of the wanted problems (`order`: id -> index in the benchmark), in problem order, each
    problem from the one file that holds it; a problem in two files is refused."""
    owner: dict[str, Path] = {}
    rows: list[tuple[int, Mapping[str, Any]]] = []
    for path, records in records_by_file.items():
        ids = {str(r["id"]) for r in records}
        for pid in sorted(ids & owner.keys()):
            same = _responses_of(records, pid) == _responses_of(records_by_file[owner[pid]], pid)
            raise UserError(
                f"{folder}: problem {pid} has responses in both {owner[pid].name} and {path.name} "
                f"({'the same responses' if same else 'different responses'}): sampled twice",
                fix="keep one: delete that problem's lines from one of the files (or the file), then SUMMARY=1",
            )
        owner.update(dict.fromkeys(ids, path))
        rows += [(order[str(r["id"])], r) for r in records if str(r["id"]) in order]
    rows.sort(key=lambda t: t[0])  # stable: each problem's responses keep their file's order
    return [r for _, r in rows]


def _responses_of(records: Sequence[Mapping[str, Any]], pid: str) -> list[Mapping[str, Any]]:
    return [r for r in records if str(r["id"]) == pid]


def missing_error(folder: Path, missing: Sequence[int], total: int, counts: set[int]) -> UserError:
    """The error of a summary asked for while problems (their indices) have no responses."""
    if not counts:
        return UserError(
            f"{folder}: {len(missing)} of {total} problems have no responses yet; no summary written",
            fix="run the same make eval without SUMMARY=1 to sample them",
        )
    shards = [Shard(i, n) for n in sorted(counts) for i in sorted({m % n for m in missing})]
    shown = ", ".join(f"SHARD={s}" for s in shards)
    return UserError(
        f"{folder}: {len(missing)} of {total} problems have no responses yet (shards not finished: "
        f"{', '.join(map(str, shards))}); no summary written",
        fix=f"run the same make eval with {shown} (one a node; each resumes), then SUMMARY=1; "
        "or the same make eval without SHARD= samples all that is missing on one node",
    )
