"""The eval folder of one benchmark (e.g. <run>/eval/step_30/test/):

    settings.json     what was sampled how (model, benchmark file and its sha256, K, temperature, top_p,
                      max new tokens, grader); a rerun with other settings is refused, not mixed in
    responses.jsonl   every response: id, source, sample, text, pred, correct, length, truncated
    summary.json      tools/eval/summary.py's figures, overall and per data source

responses.jsonl is rewritten atomically after each batch of problems, whole problems only, so a stopped
evaluation resumes where it was: a rerun samples only the problems that have no responses yet.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tools import atomic
from tools.errors import UserError

SETTINGS = "settings.json"
RESPONSES = "responses.jsonl"
SUMMARY = "summary.json"


class EvalFolder:
    def __init__(self, path: Path, settings: Mapping[str, Any]) -> None:
        self.path = path
        self.settings = dict(settings)
        self.records: list[dict[str, Any]] = []
        had = self.path / SETTINGS
        if had.is_file():
            old = json.loads(had.read_text())
            changed = sorted(k for k in set(old) | set(self.settings) if old.get(k) != self.settings.get(k))
            if changed and (self.path / RESPONSES).is_file():
                shown = "; ".join(f"{k}: {old.get(k)!r} then, {self.settings.get(k)!r} now" for k in changed)
                raise UserError(
                    f"{self.path}: holds responses sampled with other settings ({shown})",
                    fix=f"give OUT=<another folder>, or delete {self.path} to start again",
                )
        if (self.path / RESPONSES).is_file():
            self.records = read_responses(self.path / RESPONSES)
        self.path.mkdir(parents=True, exist_ok=True)
        atomic.write_json(had, self.settings)

    def done(self) -> set[str]:
        """The problems whose responses are all written."""
        k = int(self.settings["k"])
        counts: dict[str, int] = {}
        for r in self.records:
            counts[r["id"]] = counts.get(r["id"], 0) + 1
        return {pid for pid, n in counts.items() if n >= k}

    def add(self, records: Iterable[Mapping[str, Any]]) -> None:
        self.records.extend(dict(r) for r in records)
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.records)
        atomic.write_bytes(self.path / RESPONSES, text.encode())

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
