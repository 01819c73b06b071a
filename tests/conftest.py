"""Shared fixtures, and which tests a session runs.

A pytest session runs for one stack (tools.stacks.resolve: $ASCEND_R1_STACK, else the stack of the
environment it runs in, else the default), in that stack's environment (`make test` runs one session per
stack, each in its own `.venv-<stack>-<profile>`):
- tests/<stack>/ hold the tests of one stack's patches and runs; a session collects only its own stack's;
- every other test is the project's own tools: it runs once, in the first session (ASCEND_R1_TEST_SHARED=0
  leaves it out of the others), except a module marked `every_stack` (it exercises upstream code, so it
  must hold on each stack: the weight converters' megatron-core oracle, recipes against verl's config).

Tests of a patch run against the stack's applied tree under third_party/ (`make bootstrap`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO)) if str(REPO) not in sys.path else None

from tools import stacks  # noqa: E402
from tools.patches.config import load_upstreams  # noqa: E402

STACK = stacks.resolve().name
SHARED = os.environ.get("ASCEND_R1_TEST_SHARED", "1") != "0"


def _trees_under_test_first() -> None:
    """`ASCEND_R1_TREE_<NAME>` (set by `make verify-patch-tests` for a scratch tree built without one
    patch) goes first on sys.path and PYTHONPATH, so that every `import verl` (or megatron, vllm), here and
    in the processes tests start, takes that tree rather than the editable install of third_party/.

    An overlay upstream (the cpu profile's vLLM: compiled kernels only in the installed build) is imported
    from the installed build, with the modules its series changes taken from the tree
    (tools.patches.overlay_import), here and in the processes tests start."""
    overlays = {
        f"ASCEND_R1_TREE_{up.name.upper().replace('-', '_')}": up
        for up in load_upstreams(REPO, STACK).values()
        if up.overlay
    }
    plans = []
    for key, value in sorted(os.environ.items()):
        if not (key.startswith("ASCEND_R1_TREE_") and value):
            continue
        if key in overlays:
            plans.append(_overlay_plan(overlays[key], Path(value)))
            continue
        sys.path.insert(0, value)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [value, os.environ.get("PYTHONPATH")]))
    if plans:
        from tools.patches import overlay_import

        os.environ[overlay_import.ENV] = json.dumps(plans)
        overlay_import.install_from_env()
        site_dir = str(overlay_import.SITE_DIR)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [site_dir, os.environ.get("PYTHONPATH")]))


def _overlay_plan(up, tree: Path) -> dict:
    """The modules to take from `tree`: every file the tree under test or the installed series changes."""
    from tools.patches import overlay_import, sources

    base = subprocess.run(
        ["git", "-C", str(up.tree), "rev-parse", "--verify", sources.BASE_REF],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    paths = overlay_import.files(tree, base) | overlay_import.files(up.tree, base)
    return {"site": sysconfig.get_paths()["purelib"], "tree": str(tree), "files": sorted(paths)}


_trees_under_test_first()


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    """Another stack's folder is not collected at all (its modules import that stack's upstreams)."""
    path = Path(collection_path)
    if path.parent == TESTS and path.is_dir() and path.name in stacks.load() and path.name != STACK:
        return True
    return None


def pytest_collection_modifyitems(config, items) -> None:
    """Shared tests run once: in a session with ASCEND_R1_TEST_SHARED=0 only this stack's and the
    `every_stack` tests remain."""
    if SHARED:
        return
    keep, drop = [], []
    for item in items:
        own = Path(str(item.fspath)).is_relative_to(TESTS / STACK)
        (keep if own or item.get_closest_marker("every_stack") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_header(config) -> str:
    return f"ascend-r1 stack: {STACK} ({sys.prefix}); shared tests: {'yes' if SHARED else 'no (run once elsewhere)'}"


def upstream_tree(name: str) -> Path:
    """Path of the (patched) working tree of upstream `name` of this session's stack, as `make bootstrap`
    leaves it.

    `ASCEND_R1_TREE_<NAME>` (upper case, '-' -> '_') points elsewhere, e.g. at a scratch tree.
    Fails (not skips) when the tree is absent: a patch whose test cannot run is not tested.
    """
    override = os.environ.get(f"ASCEND_R1_TREE_{name.upper().replace('-', '_')}")
    if override:
        return Path(override)
    path = load_upstreams(REPO, STACK)[name].tree
    if not (path / ".git").exists():
        pytest.fail(
            f"{path} has no source tree: run `make bootstrap STACK={STACK}` "
            f"(or `make apply-patches STACK={STACK} UP={name}`)"
        )
    return path


@pytest.fixture
def repo_root() -> Path:
    return REPO
