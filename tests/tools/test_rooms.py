"""The rooms of tools/ keep their direction: what reads a run (the analyses, tools/analysis, and the report,
tools/report) never imports, directly or through others, what makes or exports a model (the miniature,
tools/miniature, and the weight converters, tools/weights): drawing a page must not be able to pre-train
or export one. And no module of tools/ is over 500 lines (the project's standard)."""

from __future__ import annotations

from pathlib import Path

from tests.tools.test_imports import imports

REPO = Path(__file__).resolve().parents[2]
READERS = ("tools.analysis", "tools.report")
MAKERS = ("tools.miniature", "tools.weights")
MAX_LINES = 500


def _within(name: str, rooms: tuple[str, ...]) -> bool:
    return any(name == r or name.startswith(r + ".") for r in rooms)


def reachable(edges, start: str) -> dict[str, list[str]]:
    """Every module `start` imports, directly or not, with one import path to it."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop()
        for w in sorted(graph.get(v, ())):
            if w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    return paths


def test_no_analysis_or_report_module_reaches_a_model_maker() -> None:
    edges = imports()
    readers = sorted({e.source for e in edges if _within(e.source, READERS)})
    assert readers, "no analysis or report module found: the rooms moved?"
    bad = []
    for r in readers:
        for target, path in reachable(edges, r).items():
            if _within(target, MAKERS):
                bad.append(" -> ".join(path))
    assert not bad, "an analysis or the report imports a model maker:\n  " + "\n  ".join(bad)


def test_the_check_sees_an_import_of_a_model_maker(tmp_path: Path) -> None:
    """The graph search finds such a path when there is one (a made-up module graph)."""

    class E:
        def __init__(self, source: str, target: str) -> None:
            self.source, self.target = source, target

    edges = [
        E("tools.report.build", "tools.analysis.learning"),
        E("tools.analysis.learning", "tools.miniature.x"),
    ]
    assert reachable(edges, "tools.report.build")["tools.miniature.x"] == [
        "tools.report.build",
        "tools.analysis.learning",
        "tools.miniature.x",
    ]


def test_no_module_is_over_500_lines() -> None:
    long = [
        f"{p.relative_to(REPO)}: {n} lines"
        for p in sorted((REPO / "tools").rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    ]
    assert not long, "split these modules:\n  " + "\n  ".join(long)
