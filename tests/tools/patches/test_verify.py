"""tools/patches/verify.py on a real demo project: a patch whose test fails without it is 'tested'; a
patch whose test passes anyway is 'NOT TESTED'; a test that fails even with the series is an error.
The record (tools/patches/record.py, patches/<stack>/verified.toml): the digest follows what a verdict
depends on, and --only-changed verifies only the patches whose record does not match."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from tests.tools.patches.gitfixtures import project_with_patch, sh
from tools.patches import __main__ as patches_cli
from tools.patches import manager, verify
from tools.patches import record as rec
from tools.patches.config import load_upstreams
from tools.patches.series import load_series

# reads the demo tree the way tests/conftest.py upstream_tree does: ASCEND_R1_TREE_DEMO
GREETING_TEST = """
import os, pathlib

def test_greeting_is_hi():
    tree = pathlib.Path(os.environ.get("ASCEND_R1_TREE_DEMO", pathlib.Path(__file__).parents[1] / "third_party/demo"))
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


# --- the record -----------------------------------------------------------------------------------------

GREET = "demo-core-change-greeting.patch"
RAISE_Y = "demo-util-raise-Y.patch"
# the second patch's own test: it imports a helper module of the tests, whose change must count too
UTIL_TEST = """
import os, pathlib
from tests import demo_helper

def test_y_is_raised():
    tree = pathlib.Path(os.environ.get("ASCEND_R1_TREE_DEMO", pathlib.Path(__file__).parents[1] / "third_party/demo"))
    assert demo_helper.EXPECTED in (tree / "util.py").read_text()
"""


@pytest.fixture
def recorded(project):
    """The demo project with a test of its own for each patch (both fail without their patch)."""
    (project.root / "tests" / "__init__.py").write_text("")
    (project.root / "tests" / "demo_helper.py").write_text('EXPECTED = "Y = 20"\n')
    (project.root / "tests" / "test_util.py").write_text(UTIL_TEST)
    _retarget(project, RAISE_Y, "tests/test_util.py")
    (project.root / "locks" / "alpha").mkdir(parents=True)
    (project.root / "locks" / "alpha" / "cpu.txt").write_text("pytest==8.0.0\n")
    return project


def _digests(project) -> dict[str, str]:
    ups = list(load_upstreams(project.root).values())
    return {p.name: rec.digest(p, ups, "cpu") for p in load_series(ups[0])}


def _edit(path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def test_the_digest_follows_what_the_verdict_depends_on_and_nothing_else(recorded):
    root = recorded.root
    first = _digests(recorded)
    assert first[GREET] != first[RAISE_Y] and all(len(d) == 64 for d in first.values())

    # nothing it depends on: a test no patch names, a doc, the lock of another profile, the toml's comments
    (root / "tests" / "test_always.py").write_text(ALWAYS_TEST + "# edited\n")
    (root / "README.md").write_text("docs\n")
    (root / "locks" / "alpha" / "npu.txt").write_text("torch-npu==1\n")
    toml = root / "patches" / "alpha" / "upstreams.toml"
    toml.write_text("# a comment\n" + toml.read_text())
    assert _digests(recorded) == first

    def changed_by(edit) -> set[str]:
        before = _digests(recorded)
        edit()
        after = _digests(recorded)
        return {name for name in after if after[name] != before[name]}

    patches = root / "patches" / "alpha" / "demo"
    # the patch itself (its message too: the record is of the file)
    assert RAISE_Y in changed_by(lambda: _edit(patches / RAISE_Y, "Why it is needed.", "Why it is needed!"))
    # a Tested-By test changes only its own patch's digest
    assert changed_by(lambda: _edit(root / "tests" / "test_demo.py", "import os", "import os  # x")) == {
        GREET
    }
    # a module that test imports, and a conftest.py above it
    assert changed_by(lambda: _edit(root / "tests" / "demo_helper.py", "20", "20  # y")) == {RAISE_Y}
    conftest = root / "tests" / "conftest.py"
    assert changed_by(lambda: conftest.write_text("# fixtures\n")) == {GREET, RAISE_Y}
    package = root / "tests" / "__init__.py"  # the package above both tests
    assert changed_by(lambda: package.write_text("# tests\n")) == {GREET, RAISE_Y}
    # the pin, an earlier patch of the series (the tree without the later one is built on it), the lock
    assert changed_by(lambda: _edit(toml, 'tag = "v1"', 'tag = "v1.0"')) == {GREET, RAISE_Y}
    assert RAISE_Y in changed_by(lambda: _edit(patches / GREET, "Why it is needed.", "Why it is needed!"))
    lock = root / "locks" / "alpha" / "cpu.txt"
    assert changed_by(lambda: lock.write_text("pytest==8.0.1\n")) == {GREET, RAISE_Y}
    # a patch dropped from the series changes the tree every other patch is verified on
    series = patches / "series"
    assert changed_by(lambda: series.write_text(series.read_text().replace(RAISE_Y, ""))) == {GREET}


def test_the_record_file_reads_back_what_was_written(tmp_path):
    entries = {
        "b/z.patch": rec.Entry("f" * 64, "tested", "2026-11-23", 12.3, "cpu", ['t::a "quoted"', "t::b"]),
        "a/y.patch": rec.Entry("e" * 64, "tested", "2026-11-22", 1.0, "cpu", []),
    }
    (tmp_path / "patches" / "s").mkdir(parents=True)
    rec.save(tmp_path, "s", entries)
    text = rec.record_path(tmp_path, "s").read_text()
    assert text.index('["a/y.patch"]') < text.index('["b/z.patch"]')  # sorted: a stable diff
    assert rec.load(tmp_path, "s") == entries
    rec.record_path(tmp_path, "s").write_text("[broken\n")
    with pytest.raises(rec.UserError, match="verified.toml: not valid TOML"):
        rec.load(tmp_path, "s")


def test_only_a_tested_verdict_on_the_same_digest_counts():
    entry = rec.Entry("a" * 64, "tested")
    assert rec.matches(entry, "a" * 64)
    assert not rec.matches(entry, "b" * 64)
    assert not rec.matches(rec.Entry("a" * 64, "NOT TESTED"), "a" * 64)
    assert not rec.matches(rec.Entry("a" * 64, "error"), "a" * 64)
    assert not rec.matches(None, "a" * 64)


def _run(project, said=None, **kw):
    out = verify.verify(
        [project.upstream()], report=(said.append if said is not None else lambda *_: None), **kw
    )
    return {o.patch: o for o in out}


@pytest.mark.slow  # a pytest process per patch verified
def test_only_changed_skips_recorded_patches_and_verifies_stale_ones(recorded):
    root = recorded.root
    full = _run(recorded, control_run=False)
    assert {n: (o.verdict, o.recorded) for n, o in full.items()} == {
        GREET: ("tested", False),
        RAISE_Y: ("tested", False),
    }
    record = rec.load(root, "alpha")
    digests = _digests(recorded)
    assert {k: e.digest for k, e in record.items()} == {f"demo/{n}": d for n, d in digests.items()}
    assert record[f"demo/{RAISE_Y}"].failed == ["tests.test_util::test_y_is_raised"]

    # nothing changed: nothing runs, each patch is said to be verified earlier
    said: list[str] = []
    again = _run(recorded, said, control_run=False, only_changed=True)
    assert all(o.verdict == "tested" and o.recorded for o in again.values())
    assert f"{RAISE_Y}: verified earlier (record {digests[RAISE_Y][:12]})" in "\n".join(said)
    assert not any("left out, its" in line for line in said)

    # a patch's test changed: that patch alone is verified again, and its record follows
    _edit(root / "tests" / "test_util.py", "import os", "import os  # edited")
    said = []
    stale = _run(recorded, said, control_run=False, only_changed=True)
    assert (stale[GREET].recorded, stale[RAISE_Y].recorded) == (True, False)
    assert stale[RAISE_Y].verdict == "tested"
    assert [line for line in said if "left out, its" in line] == [
        line for line in said if RAISE_Y in line and "left out" in line
    ]
    assert rec.load(root, "alpha")[f"demo/{RAISE_Y}"].digest == _digests(recorded)[RAISE_Y]

    # a record whose verdict is not 'tested' never counts, even on the same digest
    record = rec.load(root, "alpha")
    record[f"demo/{GREET}"].verdict = "NOT TESTED"
    rec.save(root, "alpha", record)
    assert not _run(recorded, control_run=False, only_changed=True)[GREET].recorded


@pytest.mark.slow
def test_a_changed_patch_whose_tests_pass_without_it_fails_and_loses_its_record(recorded, capsys):
    _run(recorded, control_run=False)
    # the helper now expects what the pristine util.py has too: the test no longer needs the patch
    _edit(recorded.root / "tests" / "demo_helper.py", '"Y = 20"', '"Y = 2"')
    out = _run(recorded, control_run=False, only_changed=True)
    assert out[GREET].recorded and out[GREET].verdict == "tested"
    assert out[RAISE_Y].verdict == "NOT TESTED" and not out[RAISE_Y].recorded
    assert f"demo/{RAISE_Y}" not in rec.load(recorded.root, "alpha")
    # and it stays stale: the next CI run verifies it again rather than trusting an old entry, and fails,
    # naming the patch and what to run
    args = argparse.Namespace(patch=None, control=False, jobs=1, only_changed=True, profile="cpu")
    assert patches_cli._verify_tests(args, [recorded.upstream()]) == 1
    said = capsys.readouterr()
    assert f"error: demo/{RAISE_Y}: NOT TESTED: all its tests pass without it" in said.err
    assert f"make verify-patch-tests STACK=alpha PATCH={RAISE_Y}" in said.err
    assert f"record is stale for 1 patch(es) of stack alpha (demo/{RAISE_Y})" in said.out


@pytest.mark.slow
def test_the_command_says_whether_the_record_matched(recorded, capsys):
    args = argparse.Namespace(patch=None, control=False, jobs=1, only_changed=False, profile="cpu")
    assert patches_cli._verify_tests(args, [recorded.upstream()]) == 0
    args.only_changed = True
    capsys.readouterr()
    assert patches_cli._verify_tests(args, [recorded.upstream()]) == 0
    assert "record matches for all 2 patches of stack alpha" in capsys.readouterr().out


def test_scratch_trees_take_their_cached_bytecode_with_them(tmp_path, monkeypatch):
    """make sets PYTHONPYCACHEPREFIX (build/pycache): the bytecode of a scratch tree's modules lands there
    under the scratch folder's own (temporary) name, and goes when the folder does."""
    cache = tmp_path / "pycache"
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(cache))
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    with verify.scratch_dir() as work:
        (work / "scratch_module.py").write_text("VALUE = 1\n")
        subprocess.run([sys.executable, "-c", "import scratch_module"], cwd=work, check=True)
        cached = cache / work.relative_to(work.anchor)
        assert list(cached.rglob("scratch_module*.pyc")), "the interpreter cached no bytecode there"
    assert not cached.exists()
