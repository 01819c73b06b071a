"""tools/patches/verify.py on a real demo project: a patch whose test fails without it is 'tested'; a
patch whose test passes anyway is 'NOT TESTED'; a test that fails even with the series is an error."""

from __future__ import annotations

import pytest

from tests.patches.gitfixtures import project_with_patch, sh
from tools.patches import manager, verify

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
    said = []
    out = {o.patch: o for o in verify.verify([project.upstream()], report=said.append)}
    assert {o.verdict for o in out.values()} == {"error"}
    assert "tests fail WITH the whole series" in out["demo-util-raise-Y.patch"].detail
    # the report says why, not only which: the failing assertion reaches the (CI) log
    report = "\n".join(said)
    assert "test_broken::test_broken" in report
    assert "assert False" in report


@pytest.mark.slow
def test_without_the_control_run_only_the_patches_are_verified(project):
    """--no-control (CI, right after `make test`): no control pytest run; each patch still gets its run
    without it, so an untested patch is still caught."""
    _retarget(project, "demo-util-raise-Y.patch", "tests/test_always.py")
    said = []
    out = {o.patch: o for o in verify.verify([project.upstream()], report=said.append, control_run=False)}
    assert not any("control run, the whole series" in line for line in said)
    assert out["demo-core-change-greeting.patch"].verdict == "tested"
    assert out["demo-util-raise-Y.patch"].verdict == "NOT TESTED"


@pytest.mark.slow
def test_one_patch_chosen_is_verified_on_the_whole_series_it_builds_on(project):
    # a third patch edits what the first one changed: it applies only on top of it
    project.commit_in_tree(
        "hello.py",
        "def greet():\n    return 'hi there'\n\n\ndef other():\n    return 1\n",
        subject="demo: core: other",
    )
    manager.export(project.upstream())
    name = "demo-core-other.patch"
    path = project.root / "patches" / "alpha" / "demo" / name
    path.write_text(
        path.read_text().replace("Tested-By: tests/test_demo.py", "Tested-By: tests/test_other.py")
    )
    (project.root / "tests" / "test_other.py").write_text(
        GREETING_TEST.replace("greeting_is_hi", "greeting_is_hi_there").replace(
            "return 'hi'", "return 'hi there'"
        )
    )
    out = verify.verify([project.upstream()], only=[name], report=lambda *_: None)
    assert [(o.patch, o.verdict) for o in out] == [(name, "tested")]


@pytest.mark.slow
def test_patches_verified_at_once_give_the_same_verdicts_in_series_order(project):
    """JOBS=2: two patches verified at the same time, each on its own scratch tree (a shared tree would
    give the second run the first one's series)."""
    _retarget(project, "demo-util-raise-Y.patch", "tests/test_always.py")
    out = verify.verify([project.upstream()], report=lambda *_: None, control_run=False, jobs=2)
    assert [(o.patch, o.verdict) for o in out] == [
        ("demo-core-change-greeting.patch", "tested"),
        ("demo-util-raise-Y.patch", "NOT TESTED"),
    ]
