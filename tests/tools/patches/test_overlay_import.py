"""An overlay upstream's tree under test (tools.patches.overlay_import): the installed build is imported,
except the modules the series changes, which come from the tree; in this process and in the processes it
starts (the sitecustomize of overlay_site). And the subject of an overlaid series names the project."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools.patches.gitfixtures import sh
from tools.patches import overlay_import
from tools.patches.config import PyPIRelease, Upstream
from tools.patches.series import subject_prefix


@pytest.fixture
def layout(tmp_path):
    """site/pkg (the installed build: a, b, sub/c) and tree/pkg (its source; HEAD changes a and sub/__init__)."""
    site, tree = tmp_path / "site", tmp_path / "tree"
    for root in (site, tree):
        (root / "pkg" / "sub").mkdir(parents=True)
        (root / "pkg" / "__init__.py").write_text("")
        (root / "pkg" / "a.py").write_text("WHO = 'built'\n")
        (root / "pkg" / "b.py").write_text("WHO = 'built'\n")
        (root / "pkg" / "sub" / "__init__.py").write_text("WHO = 'built'\n")
        (root / "pkg" / "sub" / "c.py").write_text("WHO = 'built'\n")
    (site / "pkg" / "compiled_only.py").write_text("WHO = 'built only'\n")  # a file the source lacks
    sh(tree, "init", "-q")
    sh(tree, "add", "-A")
    sh(tree, "commit", "-q", "-m", "pristine")
    base = sh(tree, "rev-parse", "HEAD")
    (tree / "pkg" / "a.py").write_text("WHO = 'tree'\n")
    (tree / "pkg" / "sub" / "__init__.py").write_text("WHO = 'tree'\n")
    sh(tree, "commit", "-q", "-am", "patch")
    return site, tree, base


@pytest.fixture
def clean_import():
    saved_meta, saved_path = list(sys.meta_path), list(sys.path)
    yield
    sys.meta_path[:], sys.path[:] = saved_meta, saved_path
    for name in [m for m in sys.modules if m == "pkg" or m.startswith("pkg.")]:
        del sys.modules[name]


def test_files_are_what_the_series_changes(layout):
    site, tree, base = layout
    assert overlay_import.files(tree, base) == {"pkg/a.py", "pkg/sub/__init__.py"}


def test_changed_modules_come_from_the_tree_and_the_rest_from_the_build(layout, clean_import):
    site, tree, base = layout
    sys.path.insert(0, str(site))
    overlay_import.install(site, tree, overlay_import.files(tree, base))
    import pkg.a
    import pkg.b
    import pkg.compiled_only
    import pkg.sub
    import pkg.sub.c

    assert (pkg.a.WHO, pkg.sub.WHO) == ("tree", "tree")
    assert (pkg.b.WHO, pkg.sub.c.WHO, pkg.compiled_only.WHO) == ("built", "built", "built only")
    assert Path(pkg.sub.c.__file__).is_relative_to(site), "a redirected package must keep the build's folder"


def test_processes_started_with_the_plan_import_the_same(layout):
    site, tree, base = layout
    plan = [{"site": str(site), "tree": str(tree), "files": sorted(overlay_import.files(tree, base))}]
    env = {
        **os.environ,
        overlay_import.ENV: json.dumps(plan),
        "PYTHONPATH": os.pathsep.join([str(overlay_import.SITE_DIR), str(site)]),
    }
    out = subprocess.run(
        [sys.executable, "-c", "import pkg.a, pkg.b; print(pkg.a.WHO, pkg.b.WHO)"],
        env=env, capture_output=True, text=True, check=True, cwd=site.parent,
    ).stdout.split()  # fmt: skip
    assert out == ["tree", "built"]


def test_a_changed_file_that_is_not_python_is_refused(layout):
    site, tree, _ = layout
    with pytest.raises(ValueError, match="not a Python file"):
        overlay_import.RedirectFinder(site, tree, {"pkg/kernel.so"})


def test_an_overlaid_series_is_mailed_to_the_project_it_patches():
    up = Upstream("vllm-cpu", Path("t"), "u", "v0.29.0", None, pypi=PyPIRelease("vllm", "0.29.0", "0" * 64))
    assert subject_prefix(up) == "vllm-cpu"  # not overlaid: the upstream's own name
    assert subject_prefix(dataclasses.replace(up, overlay="vllm-cpu")) == "vllm"
