"""The import graph of tools/: no two modules import each other, directly or through others, and an
import of a tools module inside a function is there only to keep third-party packages (torch, verl,
transformers, omegaconf, ...) out of the commands that do not need them, with a comment that says so.

A command line's `__main__` may import each verb's module inside the verb, with a comment starting `verb:`:
nothing imports an entry point, so no circle closes through it, and a command pays only for what it runs.

Read with `ast`, without importing anything: module-level imports and imports inside functions both count
(an import moved into a function hides a circle from Python, not from this graph).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools"

# modules whose in-function imports are still being reworked on other branches of the same change:
# checked for cycles, not yet for reasons (none left)
PENDING_REASONS: tuple[str, ...] = ()


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the tools module it names
    line: int
    in_function: bool
    comment: str  # the comment on the import's line or on the line just above it ("" when none)


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = REPO) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted((root / "tools").rglob("*.py"))}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The tools module `name` denotes: itself, or the package that holds the attribute it names."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _comment(lines: list[str], lineno: int) -> str:
    """The comment on the import's line, else the one just above it or above the imports it follows."""
    here = lines[lineno - 1]
    if "#" in here:
        return here.split("#", 1)[1].strip()
    for above in reversed(lines[: lineno - 1]):
        above = above.strip()
        if above.startswith("#"):
            return above[1:].strip()
        if above and not above.startswith(("from ", "import ")):
            return ""
    return ""


def imports(root: Path = REPO) -> list[Import]:
    """Every import of a tools module by a tools module."""
    known = modules(root)
    found: list[Import] = []
    for name, path in known.items():
        text = path.read_text()
        lines = text.splitlines()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]

        def visit(
            node: ast.AST,
            in_function: bool,
            name: str = name,
            package: str = package,
            lines: list[str] = lines,
        ) -> None:
            for child in ast.iter_child_nodes(node):
                inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
                targets: list[str] = []
                if isinstance(child, ast.Import):
                    targets = [a.name for a in child.names]
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                        base = ".".join([*parts, *([child.module] if child.module else [])])
                    targets = [
                        f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in child.names
                    ]
                for t in targets:
                    if t == "tools" or t.startswith("tools."):
                        target = _resolve(t, known)
                        if target and target != name:
                            found.append(
                                Import(name, target, child.lineno, inner, _comment(lines, child.lineno))
                            )
                visit(child, inner)

        visit(ast.parse(text, filename=str(path)), False)
    return found


def cycles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(found)


def third_party_at_import(root: Path = REPO) -> dict[str, set[str]]:
    """For each tools module, the non-stdlib, non-tools packages that importing it loads: its own
    module-level imports (outside `if TYPE_CHECKING:`) and those of the tools modules it imports there."""
    known = modules(root)
    own: dict[str, set[str]] = {}
    deps: dict[str, set[str]] = {}
    for name, path in known.items():
        own[name], deps[name] = set(), set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _module_level(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                heads = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                heads = [base, *(f"{base}.{a.name}" for a in node.names)]  # `from pkg import submodule`
            for h in heads:
                top = h.split(".")[0]
                if top == "tools":
                    target = _resolve(h, known)
                    if target and target != name:
                        deps[name].add(target)
                elif top and top not in sys.stdlib_module_names and top != "__future__":
                    own[name].add(top)
    # a package's __init__ runs before its submodules
    for name in known:
        parent = name.rpartition(".")[0]
        if parent in known:
            deps[name].add(parent)
    result: dict[str, set[str]] = {}

    def heavy(name: str, seen: frozenset[str]) -> set[str]:
        if name in result:
            return result[name]
        found = set(own[name])
        for d in deps[name] - seen:
            found |= heavy(d, seen | {name})
        if not seen:
            result[name] = found
        return found

    for name in known:
        heavy(name, frozenset())
    return result


def _module_level(tree: ast.Module):
    """The import statements that run when the module is imported (TYPE_CHECKING blocks left out)."""
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            test = ast.unparse(node.test)
            if "TYPE_CHECKING" not in test:
                todo += node.body
            todo += node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody + [h for x in node.handlers for h in x.body]
        elif isinstance(node, ast.With):
            todo += node.body


def unjustified(root: Path = REPO, pending: tuple[str, ...] = PENDING_REASONS) -> list[str]:
    """In-function imports of tools modules that load no third-party package, or that say not why."""
    heavy = third_party_at_import(root)
    bad = []
    for i in sorted(set(imports(root)), key=lambda i: (i.source, i.line, i.target)):
        if not i.in_function or any(i.source == p or i.source.startswith(p + ".") for p in pending):
            continue
        where = f"{modules(root)[i.source].relative_to(root)}:{i.line} imports {i.target}"
        if i.source.endswith(".__main__") and i.comment.startswith("verb:"):
            continue  # an entry point's verb loads its own module only when it runs (nothing imports __main__)
        if not heavy.get(i.target):
            bad.append(
                f"{where} inside a function, but it loads no third-party package: import it at the top"
            )
        elif not i.comment:
            bad.append(
                f"{where} inside a function without a comment saying why (it loads {sorted(heavy[i.target])})"
            )
    return bad


def test_tools_has_no_import_cycle():
    found = cycles(imports())
    assert found == [], "modules that import each other (directly or through others): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_every_in_function_import_of_a_tools_module_keeps_a_package_out_and_says_so():
    bad = unjustified()
    assert bad == [], "\n".join(bad)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_cycle_hidden_in_a_function_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "tools/__init__.py": "",
            "tools/a.py": "from tools import b\n",
            "tools/b.py": "def f():\n    from tools.c import x  # noqa\n",
            "tools/c.py": "from tools.a import y\n",
            "tools/d.py": "from tools import a\n",
        },
    )
    assert cycles(imports(root)) == [["tools.a", "tools.b", "tools.c"]]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("def f():\n    from tools import light\n", "loads no third-party package"),
        ("def f():\n    from tools import heavy\n", "without a comment"),
        ("def f():\n    from tools import indirect\n", "without a comment"),
        ("def f():\n    from tools import typed\n", "loads no third-party package"),
        ("def f():\n    # torch: not for light commands\n    from tools import heavy\n", None),
        ("def f():\n    from tools.heavy import g  # torch\n", None),
        ("def f():\n    # torch, for f only\n    import json\n    from tools import heavy\n", None),
        ("def f():\n    x = 1  # a comment about x\n    from tools import heavy\n", "without a comment"),
    ],
)
def test_in_function_imports_are_judged_by_what_they_load(tmp_path, body, reason):
    root = _tree(
        tmp_path,
        {
            "tools/__init__.py": "",
            "tools/light.py": "import json\nfrom tools import errors\n",
            "tools/errors.py": "import sys\n",
            "tools/heavy.py": "import torch\n",
            "tools/indirect.py": "from tools import heavy\n",
            "tools/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n",
            "tools/user.py": body,
        },
    )
    bad = unjustified(root, pending=())
    if reason is None:
        assert bad == []
    else:
        assert len(bad) == 1 and reason in bad[0] and bad[0].startswith("tools/user.py:")


def test_an_entry_points_verb_may_import_its_module_when_it_runs(tmp_path):
    root = _tree(
        tmp_path,
        {
            "tools/__init__.py": "",
            "tools/light.py": "import json\n",
            "tools/cli/__init__.py": "",
            "tools/cli/__main__.py": "def a():\n    from tools import light  # verb: only for a\n"
            "def b():\n    from tools import light  # no reason\n",
        },
    )
    bad = unjustified(root, pending=())
    assert (
        len(bad) == 1 and bad[0].startswith("tools/cli/__main__.py:4 ") and "import it at the top" in bad[0]
    )
