"""`make upstream-tests` (tools/upstream_tests) on a demo upstream with its own tests and a sanity script.

The demo upstream `demo` ships demopkg/ with tests: one that passes on the pin, one that fails on the pin
(a bug), one that needs a module no environment here has, and a header check script under
tests/special/ that its release archive leaves out. Patches break the passing test, fix the failing one,
or add a file; the runner must catch the first, report the second as newly passing, and never count the
third kind of failure.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.tools.patches.gitfixtures import TRAILERS, sh, write_toml
from tools.errors import UserError
from tools.patches import git as g
from tools.patches import manager, sources, stamp
from tools.patches.config import load_upstreams
from tools.upstream_tests import compare as cmp
from tools.upstream_tests import config
from tools.upstream_tests.compare import SESSION
from tools.upstream_tests.runner import run_upstream

pytestmark = pytest.mark.slow  # pytest sessions in subprocesses

CALC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b + 1\n"
TESTS = """
import os
from pathlib import Path

from demopkg.calc import add, sub


def test_add():
    assert add(2, 2) == 4


def test_sub():
    assert sub(3, 1) == 2


def test_needs_a_missing_module():
    import a_module_nobody_has  # noqa: F401


def test_flaky_once():
    counter = os.environ.get("DEMO_COUNTER")
    if counter:
        n = int(Path(counter).read_text() or 0) + 1 if Path(counter).exists() else 1
        Path(counter).write_text(str(n))
        assert n != 1, "fails the first time only"
"""
HEADER_CHECK = """import sys
from pathlib import Path

ACCEPTED = ["Copyright Demo Upstream"]
bad = [f for f in sys.argv[1:] if not any(h in Path(f).read_text() for h in ACCEPTED)]
for f in bad:
    print(f"missing header: {f}")
sys.exit(1 if bad else 0)
"""
CHECKS = """
[demo]
package = "demopkg"

[[demo.check]]
name = "unit"
pytest = ["tests/unit"]
env = { DEMO_COUNTER = "@COUNTER@" }

[[demo.check]]
name = "headers"
run = ["tests/special/check_header.py", "{changed:*.py}"]
needs = ["tests/special/check_header.py"]
@HARNESS@
"""


def _commit_patch(tree: Path, path: str, text: str, subject: str) -> None:
    (tree / path).parent.mkdir(parents=True, exist_ok=True)
    (tree / path).write_text(text)
    sh(tree, "add", path)
    sh(tree, "commit", "-q", "-m", f"{subject}\n\nWhy.\n\n{TRAILERS}")


class Demo:
    """A project whose upstream `demo` came from its 'release archive': the pinned commit minus tests/special."""

    def __init__(self, tmp: Path, counter: Path, harness: str = "", url: str | None = None):
        origin = tmp / "origin"
        origin.mkdir(parents=True)
        sh(origin, "init", "-q", "-b", "main")
        files = {
            "demopkg/__init__.py": "# Copyright Demo Upstream\n",
            "demopkg/calc.py": "# Copyright Demo Upstream\n" + CALC,
            "tests/unit/test_calc.py": TESTS,
            "tests/special/check_header.py": HEADER_CHECK,
        }
        for name, text in files.items():
            (origin / name).parent.mkdir(parents=True, exist_ok=True)
            (origin / name).write_text(text)
        sh(origin, "add", ".")
        sh(origin, "commit", "-q", "-m", "v1")
        self.commit = sh(origin, "rev-parse", "HEAD")
        self.root = tmp / "project"
        (self.root / "tests").mkdir(parents=True)
        sh(self.root, "init", "-q", "-b", "main")
        write_toml(self.root, url or origin.as_uri(), "v1", self.commit)
        self.tree = self.root / "third_party" / "demo"
        sh(self.root, "clone", "-q", origin.as_uri(), str(self.tree))
        # the 'archive': the pin's files without tests/special, as a parentless commit
        sh(self.tree, "rm", "-q", "-r", "tests/special")
        archive = sh(self.tree, "commit-tree", sh(self.tree, "write-tree"), "-m", "pristine demo 1 (sdist)")
        g.git(self.tree, "update-ref", sources.BASE_REF, archive)
        g.git(self.tree, "checkout", "-q", "-f", "-B", sources.BRANCH, archive)
        stamp.write(self.tree, {"source": "pypi", "base": archive})
        checks = CHECKS.replace("@COUNTER@", str(counter)).replace("@HARNESS@", harness)
        (self.root / "patches" / "alpha" / config.FILE).write_text(checks)

    def series(self, *changes: tuple[str, str, str]) -> None:
        for path, text, subject in changes:
            _commit_patch(self.tree, path, text, subject)
        manager.export(load_upstreams(self.root)["demo"])

    def run(self, tmp: Path, full: bool = False):
        up = load_upstreams(self.root)["demo"]
        spec = config.load("alpha", self.root, load_upstreams(self.root))["demo"]
        return run_upstream(up, spec, Path(sys.executable), tmp / "logs", full=full, report=lambda *_: None)


BREAK_ADD = (
    "demopkg/calc.py",
    "# Copyright Demo Upstream\n" + CALC.replace("a + b", "a + b + 1"),
    "demo: calc: break add",
)
FIX_SUB = (
    "demopkg/calc.py",
    "# Copyright Demo Upstream\n" + CALC.replace("a - b + 1", "a - b"),
    "demo: calc: fix sub",
)
NEW_FILE = (
    "demopkg/extra.py",
    "# Copyright 2026 The ascend-r1 Authors\nX = 1\n",
    "demo: extra: add a module",
)


# a harness patch teaching the demo's header check the project's header
ACCEPT_PROJECT_HEADER = (
    "Accept the project's header.\n\n"
    "diff --git a/tests/special/check_header.py b/tests/special/check_header.py\n"
    "--- a/tests/special/check_header.py\n+++ b/tests/special/check_header.py\n"
    "@@ -2,4 +2,4 @@ import sys\n from pathlib import Path\n \n"
    '-ACCEPTED = ["Copyright Demo Upstream"]\n+ACCEPTED = ["Copyright Demo Upstream", "The ascend-r1 Authors"]\n'
    " bad = [f for f in sys.argv[1:] if not any(h in Path(f).read_text() for h in ACCEPTED)]\n"
)


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("ASCEND_R1_SOURCES", "auto")
    monkeypatch.setenv("ASCEND_R1_SOURCE_CACHE", str(tmp_path / "cache"))
    return tmp_path


def _by_name(report):
    return {c.check.name: c for c in report.checks}


def _ids(items) -> set[str]:
    return {i[0].split("::")[-1] for i in items}


def test_a_patch_that_breaks_an_upstream_test_is_a_regression(env):
    demo = Demo(env, env / "counter")
    demo.series(BREAK_ADD)
    unit = _by_name(demo.run(env))["unit"]
    c = unit.comparison
    assert unit.failed and _ids(c.regressions) == {"test_add"}
    # fails on both trees: the missing module and the pin's own bug; never counted
    assert _ids(c.both_fail) == {"test_needs_a_missing_module", "test_sub"}
    # the first patched run failed test_flaky_once; it passed pristine and on the second patched run
    assert _ids(c.flaky) == {"test_flaky_once"}
    assert not c.pristine_full and c.pristine_run == 4  # only the patched failures ran pristine
    assert c.patched_run == 4 and c.patched_passed == 0


def test_a_patch_that_fixes_a_pristine_failure_is_newly_passing_not_a_failure(env):
    demo = Demo(env, env / "counter")
    demo.series(FIX_SUB)
    fast = _by_name(demo.run(env))["unit"]
    assert not fast.failed and fast.comparison.regressions == []
    (env / "counter").unlink()
    full = _by_name(demo.run(env, full=True))["unit"]
    c = full.comparison
    assert not full.failed and c.pristine_full
    assert _ids(c.newly_passing) == {"test_sub"}
    assert _ids(c.both_fail) == {"test_needs_a_missing_module"}
    # pristine: add and flaky pass; patched: add and sub pass, flaky failed its first run (then passed)
    assert c.pristine_passed == 2 and c.patched_passed == 2 and _ids(c.flaky) == {"test_flaky_once"}


def test_an_empty_series_runs_once_and_cannot_regress(env):
    demo = Demo(env, env / "counter")
    (demo.root / "patches" / "alpha" / "demo").mkdir(parents=True)
    unit = _by_name(demo.run(env))["unit"]
    assert unit.same_tree and not unit.failed
    assert unit.comparison.regressions == [] and len(unit.logs) == 1  # no pristine run, no retry


def test_the_repository_supplies_what_the_archive_lacks_and_the_harness_patch_applies_to_both(env):
    demo = Demo(env, env / "counter")
    demo.series(NEW_FILE)
    headers = _by_name(demo.run(env))["headers"]
    # the script is not in the 'archive': fetched from the repository at the pin; the new file lacks the
    # one header it accepts -> fails patched, nothing to check pristine -> a regression
    assert headers.status == "ran" and headers.failed
    assert [r[0] for r in headers.comparison.regressions] == ["headers"]
    assert "missing header: demopkg/extra.py" in headers.comparison.regressions[0][1]


def test_a_harness_patch_accepting_the_projects_header_makes_it_pass(env):
    harness_dir = env / "project" / "patches" / "alpha" / config.HARNESS_DIR
    harness_dir.mkdir(parents=True)
    (harness_dir / "accept.patch").write_text(ACCEPT_PROJECT_HEADER)
    demo = Demo(env, env / "counter", harness='harness-patches = ["accept.patch"]')
    demo.series(NEW_FILE)
    headers = _by_name(demo.run(env))["headers"]
    assert headers.status == "ran" and not headers.failed
    assert headers.comparison.patched_passed == 1


def test_without_git_access_the_repository_checks_are_skipped_with_the_reason(env, monkeypatch):
    demo = Demo(env, env / "counter", url=(env / "nowhere").as_uri())
    demo.series(NEW_FILE)
    headers = _by_name(demo.run(env))["headers"]
    assert headers.status == "skipped" and not headers.failed
    assert "git cannot reach" in headers.note and "url.<mirror>.insteadOf" in headers.note
    assert headers.command.endswith("tests/special/check_header.py '{changed:*.py}'")
    monkeypatch.setenv("ASCEND_R1_SOURCES", "pypi")  # CI: sources from the archives, tests from git
    demo2 = Demo(env / "ci", env / "counter2")
    demo2.series(NEW_FILE)
    headers = _by_name(demo2.run(env / "ci"))["headers"]
    assert headers.status == "ran" and [r[0] for r in headers.comparison.regressions] == ["headers"]


def test_a_suite_that_cannot_start_on_either_tree_is_not_a_regression():
    patched = {SESSION: cmp.Result("error", "conftest: No module named cv2")}
    pristine = {SESSION: cmp.Result("error", "conftest: No module named cv2")}
    c = cmp.compare(patched, pristine, pristine_full=True)
    assert not c.failed and [k for k, _ in c.both_fail] == [SESSION]
    broken = cmp.compare(patched, {SESSION: cmp.Result("collected")}, pristine_full=True)
    assert broken.failed and [r[0] for r in broken.regressions] == [SESSION]


def test_a_module_that_no_longer_collects_is_a_regression_and_its_tests_on_an_uncollectable_pristine_are_not():
    patched = {"t.py": cmp.Result("error", "ImportError"), "u.py::a": cmp.Result("failed")}
    pristine = {"t.py": cmp.Result("collected"), "u.py": cmp.Result("error", "ImportError")}
    assert cmp.retry_candidates(patched, pristine) == ["t.py"]
    c = cmp.compare(patched, pristine, pristine_full=False)
    assert [r[0] for r in c.regressions] == ["t.py"] and [k for k, _ in c.both_fail] == ["u.py::a"]


def test_tests_a_pristine_session_could_not_run_are_not_new_failures():
    patched = {SESSION: cmp.Result("collected"), "t.py::a": cmp.Result("failed", "boom")}
    pristine = {SESSION: cmp.Result("error", "conftest: No module named cv2")}
    assert cmp.retry_candidates(patched, pristine) == []
    c = cmp.compare(patched, pristine, pristine_full=False)
    assert not c.failed and [k for k, _ in c.both_fail] == ["t.py::a"]


def test_a_run_that_leaks_threads_is_stopped_with_its_whole_session(tmp_path, monkeypatch):
    from tools.upstream_tests import runner

    monkeypatch.setenv("ASCEND_R1_UT_MAX_THREADS", "40")
    monkeypatch.setattr(runner, "POLL", 0.3)
    code = (
        "import subprocess, sys, threading, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "open(sys.argv[1], 'w').write(str(child.pid))\n"
        "for _ in range(80): threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
        "time.sleep(600)\n"
    )
    pidfile = tmp_path / "child.pid"
    sp = runner._spawn(
        [sys.executable, "-c", code, str(pidfile)], tmp_path, dict(os.environ), tmp_path / "log", 300
    )
    assert sp.code is None and "threads (limit 40)" in sp.stopped and sp.seconds < 60
    child = int(pidfile.read_text())
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
    assert "[ascend-r1 upstream-tests] stopped" in (tmp_path / "log").read_text()


def _pin_without_commit(demo: Demo, checks_from: str) -> None:
    """The demo pin loses its commit id (as a release whose commit is unknown); checks-from names one."""
    toml = demo.root / "patches" / "alpha" / "upstreams.toml"
    toml.write_text(
        toml.read_text().replace(
            f'commit = "{demo.commit}"',
            'commit-unknown = "only the release archive"\n'
            f'pypi = {{ name = "demo", version = "1", sha256 = "{"0" * 64}" }}',
        )
    )
    checks = demo.root / "patches" / "alpha" / config.FILE
    checks.write_text(
        checks.read_text().replace('package = "demopkg"', f'package = "demopkg"\n{checks_from}')
    )


def test_a_pin_without_commit_takes_only_the_needed_check_files_from_checks_from(env):
    demo = Demo(env, env / "counter")
    demo.series(NEW_FILE)
    _pin_without_commit(demo, "")
    skipped = _by_name(demo.run(env))["headers"]
    assert skipped.status == "skipped" and "the pin has no commit id" in skipped.note
    _pin_without_commit(
        demo, f'checks-from = {{ commit = "{demo.commit}", tag = "v1", why = "nearest tag" }}'
    )
    report = demo.run(env)
    headers = _by_name(report)["headers"]
    assert headers.status == "ran" and [r[0] for r in headers.comparison.regressions] == ["headers"]
    assert (
        "from v1" in report.note
        and "nearest tag" in report.note
        and "(+1 files the archive lacks)" in report.note
    )


def test_checks_from_is_refused_where_the_pin_has_a_commit_and_must_be_a_commit_id(env):
    demo = Demo(env, env / "counter")
    checks = demo.root / "patches" / "alpha" / config.FILE
    text = checks.read_text()
    checks.write_text(
        text.replace(
            'package = "demopkg"',
            'package = "demopkg"\nchecks-from = { commit = "' + demo.commit + '", tag = "v1", why = "x" }',
        )
    )
    with pytest.raises(UserError, match="only for a pin with no commit id"):
        config.load("alpha", demo.root, load_upstreams(demo.root))
    checks.write_text(
        text.replace(
            'package = "demopkg"',
            'package = "demopkg"\nchecks-from = { commit = "v1", tag = "v1", why = "x" }',
        )
    )
    with pytest.raises(UserError, match="'v1' is not a 40-hex-digit commit id"):
        config.load("alpha", demo.root, None)


def test_a_check_not_for_ci_runs_only_with_every_check(env):
    demo = Demo(env, env / "counter")
    checks = demo.root / "patches" / "alpha" / config.FILE
    checks.write_text(checks.read_text().replace("env = { DEMO_COUNTER", "ci = false\nenv = { DEMO_COUNTER"))
    demo.series(BREAK_ADD)
    up = load_upstreams(demo.root)["demo"]
    spec = config.load("alpha", demo.root, load_upstreams(demo.root))["demo"]
    ci = _by_name(run_upstream(up, spec, Path(sys.executable), env / "l1", report=lambda *_: None))["unit"]
    assert ci.status == "skipped" and "make upstream-tests" in ci.note and not ci.failed
    every = run_upstream(up, spec, Path(sys.executable), env / "l2", every=True, report=lambda *_: None)
    assert _by_name(every)["unit"].failed and _ids(_by_name(every)["unit"].comparison.regressions) == {
        "test_add"
    }


def test_a_shell_script_check_runs_with_bash():
    from tools.upstream_tests.runner import script_command

    assert script_command(["tools/copyright.sh"], "/py") == ["bash", "tools/copyright.sh"]
    assert script_command(["tools/check.py", "a.py"], "/py") == ["/py", "tools/check.py", "a.py"]
