"""Links hold: every markdown link `[text](path#anchor)` of README.md and the other tracked .md files leads
to a file of the repository and, where it names one, to a heading (or an HTML anchor) of that file, by
GitHub's anchor rules. tests/test_citations.py checks the other way of pointing at a file: a bare name in
prose or a comment.
"""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target), the target up to a space (a "title") or the closing parenthesis
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # https:, mailto:, ...


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: the rendered text lower-cased, every character but letters, digits,
    marks, `_`, `-` and spaces dropped, spaces turned into hyphens (github-slugger)."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a file has: its headings' slugs (a repeated one gets -1, -2, ...) and HTML anchors."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(text):
        found.update(HTML_ANCHOR.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(root: Path, files: list[str]) -> list[str]:
    """`<file>:<line>: <target>: <why>` for every link to a missing file or anchor."""
    out = []
    for rel in files:
        text = (root / rel).read_text()
        for number, line in prose_lines(text):
            for m in LINK.finditer(CODE_SPAN.sub("", line)):
                target = m.group(1)
                if EXTERNAL.match(target):
                    continue
                path, _, anchor = target.partition("#")
                dest = (root / rel).parent / path if path else root / rel
                where = f"{rel}:{number}: {target}"
                if not dest.exists():
                    out.append(
                        f"{where}: no file {dest.relative_to(root) if dest.is_relative_to(root) else dest}"
                    )
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
                    out.append(f"{where}: no heading of {dest.name} has the anchor #{anchor}")
    return out


def markdown_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True, check=True)
    return [f for f in out.stdout.splitlines() if not f.startswith("third_party/") and (REPO / f).is_file()]


def test_readme_and_docs_links_lead_somewhere():
    files = markdown_files()
    assert "README.md" in files and any(f.startswith("docs/") for f in files)
    found = broken_links(REPO, files)
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Training (`make train`)", "training-make-train"),
        (
            "Every CPU: vLLM's kernel families (`launch.cpu_kernels`)",
            "every-cpu-vllms-kernel-families-launchcpu_kernels",
        ),
        (
            "A run that learns (`make train RECIPE=tiny-learn`)",
            "a-run-that-learns-make-train-recipetiny-learn",
        ),
        ("CI (`.ci/run`) and what runs outside it", "ci-cirun-and-what-runs-outside-it"),
        ("Weights: FP8 -> BF16 -> Megatron and back", "weights-fp8---bf16---megatron-and-back"),
    ],
)
def test_anchors_follow_githubs_rules(heading, anchor):
    assert slug(heading) == anchor


def test_a_link_to_a_missing_file_or_anchor_is_named(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# Title\n\n## Same\n\n## Same\n\n```\n[in code](nowhere.md)\n```\n"
    )
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md) [ok](docs/a.md#same-1) [ok](#top) [web](https://example.org/x#y) `[code](gone.md)`\n"
        '<a id="top"></a>\n'
        "[gone](docs/b.md)\n"
        "[bad anchor](docs/a.md#same-2)\n"
        "[bad here](#nowhere)\n"
    )
    found = broken_links(tmp_path, ["README.md", "docs/a.md"])
    assert found == [
        "README.md:3: docs/b.md: no file docs/b.md",
        "README.md:4: docs/a.md#same-2: no heading of a.md has the anchor #same-2",
        "README.md:5: #nowhere: no heading of README.md has the anchor #nowhere",
    ]
