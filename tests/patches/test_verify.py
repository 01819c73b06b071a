"""tools/patches/verify.py on a real demo project: a patch whose test fails without it is 'tested'; a
patch whose test passes anyway is 'NOT TESTED'; a test that fails even with the series is an error."""

from __future__ import annotations

import pytest

from tests.patches.gitfixtures import project_with_patch, sh
from tools.patches import verify

# reads the demo tree the way tests/conftest.py upstream_tree does: ASCEND_R1_TREE_DEMO
GREETING_TEST = """
import os, pathlib

def test_greeting_is_hi():
    tree = pathlib.Path(os.environ.get("ASCEND_R1_TREE_DEMO", pathlib.Path(__file__).parents[1] / "third_party/alpha/demo"))
    assert "return 'hi'" in (tree / "hello.py").read_text()
"""
ALWAYS_TEST = "def test_nothing():\n    assert 1 + 1 == 2\n"
BROKEN_TEST = "def test_broken():\n    assert False\n"


@pytest.fixture
def project(tmp_path):
    p = project_with_patch(tmp_path)
    (p.root / "tests" / "test_demo.py").write_text(GREETING_TEST)
    (p.root / "tests" / "test_always.py").write_text(ALWAYS_TEST)
    (p.root / "tests" / "test_broken.py").write_text(BROKEN_TEST)
    return p


def _retarget(project, patch_name: str, test: str) -> None:
    path = project.root / "patches" / "alpha" / "demo" / patch_name
    path.write_text(path.read_text().replace("Tested-By: tests/test_demo.py", f"Tested-By: {test}"))


def _outcomes(project):
    out = verify.verify([project.upstream()], report=lambda *_: None)
    return {o.patch: o for o in out}


@pytest.mark.slow  # one pytest process per patch, plus the control run
def test_tested_and_untested_patches(project):
    _retarget(project, "demo-util-raise-Y.patch", "tests/test_always.py")
    out = _outcomes(project)
    greet = out["demo-core-change-greeting.patch"]
    assert greet.verdict == "tested" and len(greet.failed) == 1 and greet.left_out == []
    raise_y = out["demo-util-raise-Y.patch"]
    assert raise_y.verdict == "NOT TESTED" and raise_y.detail == "all its tests pass without it"
    # the third-party tree itself is untouched: still the full series
    assert "return 'hi'" in (project.tree / "hello.py").read_text()
    assert sh(project.tree, "status", "--porcelain") == ""


@pytest.mark.slow
def test_tests_failing_with_the_series_are_an_error(project):
    _retarget(project, "demo-util-raise-Y.patch", "tests/test_broken.py")
    out = _outcomes(project)
    assert {o.verdict for o in out.values()} == {"error"}
    assert "tests fail WITH the whole series" in out["demo-util-raise-Y.patch"].detail


@pytest.mark.slow
def test_one_patch_is_checked_against_the_whole_series(project):
    """PATCH=<file>: the control run still applies every patch of the series (the others may be what the
    tests need), and only the chosen patch is left out afterwards."""
    _retarget(project, "demo-util-raise-Y.patch", "tests/test_demo.py")  # needs the greeting patch
    out = verify.verify([project.upstream()], only=["demo-util-raise-Y.patch"], report=lambda *_: None)
    assert [o.patch for o in out] == ["demo-util-raise-Y.patch"]
    assert out[0].verdict == "NOT TESTED", out[0].detail  # the greeting test passes with and without it
