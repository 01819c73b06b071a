"""Nothing a user can read cites what they cannot open: no design file that is not in the repository (the
design facts are docs/design.md), and no issue number of this project's tracker (a comment says the reason
itself). Upstream issues stay citable with their project's name ("verl issue 3996", "Megatron-LM issue 1517").
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
USER_FACING = (
    "README.md",
    "Makefile",
    "recipes/",
    "tools/",
    "docs/",
    "tests/",
    "bench/",
    "patches/",
    "requirements",
)
# .patch files carry their own trailers and records: a change to one is a new patch, not a comment edit
SKIP_SUFFIXES = (".patch",)
# files exempted while other branches rework them (none now: each entry must name a tracked file, a test
# below says so, so that a moved or deleted file does not leave a stale exemption behind)
PENDING: set[str] = set()

SELF = "tests/test_citations.py"  # its examples cite what must not be cited
DOC_NAME = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[A-Z][A-Z0-9_-]*\.md)\b")
# "issue 16", "issues 16", "issue #16", "issue-35", "issue#35", "issue35"
ISSUE = re.compile(r"\bissues?(?:[\s_-]*#|[\s_-]+|)(\d+)\b", re.I)
# an issue number is an upstream's when its project is named just before it
UPSTREAM = re.compile(
    r"(verl|vLLM|vllm|vllm-ascend|Megatron-LM|megatron-core|MindSpeed|torch|PyTorch|transformers|Ray|uv|pip)"
    r"(?:'s)?[\s#]+$"
)
SHARED = re.compile(r"shared/design")  # where the design notes lived before docs/design.md


def problems(root: Path, files: list[str]) -> list[str]:
    present = {Path(f).name for f in files} | set(files)
    found = []
    for rel in files:
        if rel.endswith(SKIP_SUFFIXES) or rel in PENDING or rel == SELF or not rel.startswith(USER_FACING):
            continue
        try:
            text = (root / rel).read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for m in DOC_NAME.finditer(text):
            name = m.group(1)
            if name not in present and Path(name).name not in present:
                found.append(
                    f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: cites {name}, not in the repository"
                )
        for m in ISSUE.finditer(text):
            if not UPSTREAM.search(text[max(0, m.start() - 40) : m.start()]):
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{rel}:{line}: cites {m.group(0)!r} of a tracker readers cannot see")
        for m in SHARED.finditer(text):
            found.append(
                f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: cites a path outside the repository"
            )
    return found


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [f for f in out.splitlines() if not f.startswith("third_party/")]


def test_user_facing_files_cite_only_what_a_reader_can_open():
    found = problems(REPO, tracked())
    assert found == [], "\n".join(found)


def test_every_pending_exemption_names_a_tracked_file():
    missing = PENDING - set(tracked())
    assert not missing, sorted(missing)


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("# the planner checks it (PATCHES.md section 4)\n", "cites PATCHES.md"),
        ("# see docs/DESIGN.md\n", "cites docs/DESIGN.md"),
        ('"""A run that learns (issue 16): R1-Zero."""\n', "cites 'issue 16'"),
        ("# background: ../shared/design/CHECKPOINTS.md\n", "CHECKPOINTS.md, not in the repository"),
        ("# fixed for issue-35\n", "cites 'issue-35'"),
        ("# see issue#35\n", "cites 'issue#35'"),
        ("# as in Issue 35\n", "cites 'Issue 35'"),
        ("# verl issue 3996 is open upstream\n", None),
        ("# verl issue-3996 is open upstream\n", None),
        ("# Megatron-LM\n# issue 1517\n", None),
        ("# see README.md and docs/launch.md\n", None),
    ],
)
def test_the_check_tells_a_dead_citation_from_a_live_one(tmp_path, text, bad):
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "x.py").write_text(text)
    (tmp_path / "README.md").write_text("")
    found = problems(tmp_path, ["tools/x.py", "README.md"])
    if bad is None:
        assert found == []
    else:
        assert found and bad in found[0] and found[0].startswith("tools/x.py:")
