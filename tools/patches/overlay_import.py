"""Import a binary distribution with an overlay upstream's tree under test in place of its patched files.

An overlay upstream (tools.patches.overlay; the cpu profile's vLLM) cannot be imported from its source
tree: the compiled kernels live only in the installed build. So when `make verify-patch-tests` points
`ASCEND_R1_TREE_<NAME>` at a scratch tree built without one patch, the tests import the installed build
as usual, except the modules whose files any patch of the series changes: those come from the scratch
tree (a meta path finder placed first). `ENV` carries the same plan to the processes the tests start
(vLLM's engine and worker processes): the `overlay_site` folder's sitecustomize installs it there.

    files(tree, base)          -> the .py files that differ between base and the tree's HEAD
    install(site, tree, files) -> the finder, put first on sys.meta_path
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ENV = "ASCEND_R1_OVERLAY_IMPORT"  # json: [{"site": ..., "tree": ..., "files": [...]}, ...]
SITE_DIR = Path(__file__).resolve().parent / "overlay_site"  # holds the sitecustomize for subprocesses


def files(tree: Path, base: str) -> set[str]:
    """Paths (relative to the tree) of the files that differ between `base` and the tree's HEAD."""
    out = subprocess.run(
        ["git", "-C", str(tree), "diff", "--name-only", "--no-renames", base, "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line for line in out.splitlines() if line}


def _module_name(path: str) -> tuple[str, bool] | None:
    """'a/b/c.py' -> ('a.b.c', False); 'a/b/__init__.py' -> ('a.b', True); other files -> None."""
    if not path.endswith(".py"):
        return None
    parts = path[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


class RedirectFinder(importlib.abc.MetaPathFinder):
    """Modules of `files` load from `tree`; packages keep searching the installed `site` for the rest."""

    def __init__(self, site: Path, tree: Path, paths: set[str]) -> None:
        self.site, self.tree = site, tree
        self.modules: dict[str, tuple[str, bool]] = {}
        for path in paths:
            named = _module_name(path)
            if named is None:
                raise ValueError(f"{tree}: {path} is not a Python file; an overlay can only redirect modules")
            self.modules[named[0]] = (path, named[1])

    def find_spec(self, fullname, path=None, target=None):
        hit = self.modules.get(fullname)
        if hit is None:
            return None
        rel, is_package = hit
        origin = self.tree / rel
        if not origin.is_file():  # the tree under test lacks a file the series adds
            return None
        search = [str((self.site / rel).parent)] if is_package else None
        return importlib.util.spec_from_file_location(fullname, origin, submodule_search_locations=search)


def install(site: Path, tree: Path, paths: set[str]) -> RedirectFinder:
    finder = RedirectFinder(site, tree, paths)
    sys.meta_path.insert(0, finder)
    return finder


def install_from_env() -> None:
    """What the sitecustomize of `SITE_DIR` runs in every process started with `ENV` set."""
    for plan in json.loads(os.environ.get(ENV) or "[]"):
        install(Path(plan["site"]), Path(plan["tree"]), set(plan["files"]))
