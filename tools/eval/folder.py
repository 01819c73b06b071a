"""The eval folder of one benchmark (e.g. <run>/eval/step_30/test/):

    settings.json     what was sampled how (model, benchmark file and its sha256, K, temperature, top_p,
                      max new tokens, grader); a rerun with other settings is refused, not mixed in
    responses.jsonl   every response: id, source, sample, text, pred, correct, length, truncated
    summary.json      tools/eval/summary.py's figures, overall and per data source
    responses-shard-<i>-of-<n>.jsonl, settings-shard-<i>-of-<n>.json
                      node i of n's responses and settings in a sharded evaluation (shards.py)

responses.jsonl is rewritten atomically after each batch of problems, whole problems only, so a stopped
evaluation resumes where it was: a rerun samples only the problems that have no responses yet (in any of
the folder's response files).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tools import atomic
from tools.errors import UserError
from tools.eval.shards import Shard, check_shard_settings, merged_records, response_files

SETTINGS = "settings.json"
RESPONSES = "responses.jsonl"
SUMMARY = "summary.json"


class EvalFolder:
    def __init__(self, path: Path, settings: Mapping[str, Any], shard: Shard | None = None) -> None:
        self.path = path
        self.settings = dict(settings)
        self.shard = shard
        self.file = self.path / (RESPONSES if shard is None else shard.responses)  # what this run writes
        files = response_files(self.path) if self.path.is_dir() else []
        had = self.path / SETTINGS
        if had.is_file():
            old = json.loads(had.read_text())
            changed = sorted(k for k in set(old) | set(self.settings) if old.get(k) != self.settings.get(k))
            if changed and files:
                shown = "; ".join(f"{k}: {old.get(k)!r} then, {self.settings.get(k)!r} now" for k in changed)
                raise UserError(
                    f"{self.path}: holds responses sampled with other settings ({shown})",
                    fix=f"give OUT=<another folder>, or delete {self.path} to start again",
                )
        if self.path.is_dir():
            check_shard_settings(self.path, self.settings)
        self.by_file: dict[Path, list[dict[str, Any]]] = {f: read_responses(f) for f in files}
        self.records: list[dict[str, Any]] = self.by_file.setdefault(self.file, [])
        self.path.mkdir(parents=True, exist_ok=True)
        atomic.write_json(had, self.settings)
        if shard is not None:
            atomic.write_json(self.path / shard.settings, self.settings)

    def done(self) -> set[str]:
        """The problems whose responses are all written, in any of the folder's response files."""
        k = int(self.settings["k"])
        done: set[str] = set()
        for records in self.by_file.values():
            counts: dict[str, int] = {}
            for r in records:
                counts[r["id"]] = counts.get(r["id"], 0) + 1
            done |= {pid for pid, n in counts.items() if n >= k}
        return done

    def add(self, records: Iterable[Mapping[str, Any]]) -> None:
        self.records.extend(dict(r) for r in records)
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.records)
        atomic.write_bytes(self.file, text.encode())

    def merged(self, ids: list[str]) -> tuple[list[dict[str, Any]], list[int]]:
        """(the responses of problems `ids` from every response file of the folder, read again now that other
        nodes may have written theirs, in problem order; the indices of the problems not done yet)."""
        if self.shard is not None or len(response_files(self.path)) > 1:
            self.by_file = {f: read_responses(f) for f in response_files(self.path)}
            self.by_file[self.file] = self.records
        order = {pid: i for i, pid in enumerate(ids)}
        done = self.done()
        missing = [i for i, pid in enumerate(ids) if pid not in done]
        if len(self.by_file) == 1:  # one file: its responses as they are (the unsharded evaluation's path)
            return [r for r in self.records if r["id"] in order], missing
        return [dict(r) for r in merged_records(self.path, self.by_file, order)], missing

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        path = self.path / SUMMARY
        atomic.write_json(path, {"settings": self.settings, **summary})
        return path


def read_responses(path: Path) -> list[dict[str, Any]]:
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise UserError(
                f"{path}:{n}: not a JSON line ({e.msg})", fix=f"delete {path} to sample again"
            ) from None
    return out
