"""The record of `make upstream-tests` (tools/upstream_tests/record.py, patches/<stack>/upstream-tests.verified.toml).

On the demo upstream of test_upstream_tests.py: the digest follows every input of a check's verdict,
`--changed` (`make upstream-tests CHANGED=1`, CI) runs only the checks whose record is stale, a stale check
that cannot run here fails as UNVERIFIED with the command that refreshes it, and a `manual` check is
reported, never silently skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import pytest

from tests.tools.patches import test_upstream_tests as demo_tests
from tests.tools.patches.test_upstream_tests import ACCEPT_PROJECT_HEADER, NEW_FILE, Demo
from tools import stacks as st
from tools.errors import UserError
from tools.patches import record as rec
from tools.patches.config import load_upstreams
from tools.upstream_tests import __main__ as cli
from tools.upstream_tests import config
from tools.upstream_tests import record as urec
from tools.upstream_tests.runner import run_upstream

pytestmark = pytest.mark.slow  # pytest sessions in subprocesses
env = demo_tests.env  # the demo's fixture: its sources from the demo's repository, a private cache


def _demo(env: Path, url: str | None = None) -> Demo:
    """The demo with the project's header accepted by a harness patch: both of its checks pass."""
    harness = env / "project" / "patches" / "alpha" / config.HARNESS_DIR
    harness.mkdir(parents=True)
    (harness / "accept.patch").write_text(ACCEPT_PROJECT_HEADER)
    demo = Demo(env, env / "counter", harness='harness-patches = ["accept.patch"]', url=url)
    checks = demo.root / "patches" / "alpha" / config.FILE
    _edit(checks, f'DEMO_COUNTER = "{env / "counter"}"', 'DEMO_COUNTER = ""')  # not flaky: fewer runs
    (demo.root / "locks" / "alpha").mkdir(parents=True)
    (demo.root / "locks" / "alpha" / "cpu.txt").write_text("torch==2.13.0\n")
    demo.series(NEW_FILE)
    return demo


def _args(**kw) -> argparse.Namespace:
    base = dict(upstreams=[], all=True, full=False, changed=False, check=None, keep=None)
    return argparse.Namespace(**{**base, **kw})


def _run(demo: Demo, capsys, **kw) -> tuple[bool, str]:
    ok, _ = cli.run_stack(st.Stack("alpha", "demo"), Path(sys.executable), _args(**kw), root=demo.root)
    return ok, capsys.readouterr().out


def _digest(demo: Demo, check: str = "headers", **kw) -> str:
    up = load_upstreams(demo.root)["demo"]
    spec = config.load("alpha", demo.root, load_upstreams(demo.root))["demo"]
    c = next(c for c in spec.checks if c.name == check)
    return urec.digest(demo.root, up, spec, c, "cpu", **kw)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def test_the_digest_changes_with_each_input_and_only_with_them(env):
    demo = _demo(env)
    patches = demo.root / "patches" / "alpha"
    seen = {_digest(demo)}

    def changed(what: str, **kw) -> None:
        d = _digest(demo, **kw)
        assert d not in seen, f"the digest does not follow {what}"
        seen.add(d)

    _edit(patches / config.FILE, 'name = "headers"', 'what = "words"\nname = "headers"')
    assert _digest(demo) in seen, "the words of `what` are not an input"
    _edit(patches / "upstreams.toml", 'tag = "v1"', 'tag = "v1.0"')
    changed("the stack's pins")
    patch = next((patches / "demo").glob("*.patch"))
    patch.write_text(patch.read_text().replace("X = 1", "X = 2"))
    changed("the upstream's patch files")
    (patches / "demo" / "series").write_text((patches / "demo" / "series").read_text() + "# a comment\n")
    assert _digest(demo) in seen, "a comment in the series is not an input"
    _edit(
        patches / config.FILE,
        'run = ["tests/special/check_header.py"',
        'timeout = 60\nrun = ["tests/special/check_header.py"',
    )
    changed("the check's entry in the harness config")
    (patches / config.HARNESS_DIR / "accept.patch").write_text(
        ACCEPT_PROJECT_HEADER.replace("Accept", "Let through")
    )
    changed("the check's harness patch")
    (demo.root / "locks" / "alpha" / "cpu.txt").write_text("torch==2.14.0\n")
    changed("the stack's lock")
    plugins = env / "plugins"
    plugins.mkdir()
    (plugins / "p.py").write_text("X = 1\n")
    changed("the pytest plugins", plugins=plugins)
    (plugins / "p.py").write_text("X = 2\n")
    changed("a pytest plugin's bytes", plugins=plugins)
    _edit(patches / "upstreams.toml", f'commit = "{demo.commit}"', f'commit = "{"1" * 40}"')
    changed("the commit the tests come from")
    # where the pin has no commit: checks-from's commit
    up = load_upstreams(demo.root)["demo"]
    spec = config.load("alpha", demo.root, None)["demo"]
    check = spec.checks[1]
    a = config.ChecksFrom("a" * 40, "v1", "why")
    nocommit = dataclasses.replace(up, commit=None)
    one = urec.digest(demo.root, nocommit, dataclasses.replace(spec, checks_from=a), check, "cpu")
    two = urec.digest(
        demo.root,
        nocommit,
        dataclasses.replace(spec, checks_from=dataclasses.replace(a, commit="b" * 40)),
        check,
        "cpu",
    )
    assert one != two


def test_every_passing_check_is_recorded_and_changed_runs_only_the_stale_ones(env, capsys, monkeypatch):
    demo = _demo(env)
    ok, out = _run(demo, capsys)
    assert ok, out
    record = urec.load(demo.root, "alpha")
    assert set(record) == {"demo/unit", "demo/headers"}
    assert (
        record["demo/headers"].digest == _digest(demo) and record["demo/headers"].verdict == "no regressions"
    )
    assert record["demo/unit"].summary.endswith("0 regression(s)")
    assert urec.record_path(demo.root, "alpha").read_text().startswith(urec.HEADER)

    ran: list = []
    real = cli.run_upstream

    def spy(up, spec, *a, only=None, **kw):
        ran.append(only)
        return real(up, spec, *a, only=only, **kw)

    monkeypatch.setattr(cli, "run_upstream", spy)
    ok, out = _run(demo, capsys, changed=True)
    assert ok and ran == [] and "every check's record matches" in out, out

    _edit(
        demo.root / "patches" / "alpha" / config.FILE,
        'run = ["tests/special',
        'timeout = 60\nrun = ["tests/special',
    )
    ok, out = _run(demo, capsys, changed=True)
    assert ok and ran == [["headers"]], out
    assert urec.matches(urec.load(demo.root, "alpha")["demo/headers"], _digest(demo))  # renewed
    ok, out = _run(demo, capsys, changed=True)
    assert ok and ran == [["headers"]] and "every check's record matches" in out


def test_a_regression_removes_the_record(env, capsys):
    demo = _demo(env)
    assert _run(demo, capsys, check=["headers"])[0]
    assert set(urec.load(demo.root, "alpha")) == {"demo/headers"}
    (demo.root / "patches" / "alpha" / config.HARNESS_DIR / "accept.patch").write_text(
        ACCEPT_PROJECT_HEADER.replace("The ascend-r1 Authors", "Someone Else")
    )
    ok, out = _run(demo, capsys, changed=True, check=["headers"])
    assert not ok and "REGRESSION" in out
    assert "demo/headers" not in urec.load(demo.root, "alpha")


def test_a_stale_check_that_cannot_run_here_is_unverified_with_the_command_that_refreshes_it(env, capsys):
    demo = _demo(env, url=(env / "nowhere").as_uri())  # git cannot reach the repository: headers cannot run
    entries = {
        "demo/headers": rec.Entry("0" * 64, "no regressions", "2026-11-25", 1.0, "cpu"),
        "demo/unit": rec.Entry(_digest(demo, "unit"), "no regressions", "2026-11-25", 1.0, "cpu"),
    }
    urec.save(demo.root, "alpha", entries)
    ok, out = _run(demo, capsys, changed=True)
    assert not ok
    lines = [line for line in out.splitlines() if line.startswith("UNVERIFIED")]
    assert len(lines) == 1, out
    assert lines[0].startswith("UNVERIFIED alpha/demo/headers: its record is stale and it cannot run here")
    assert "git cannot reach" in lines[0]
    assert "`make upstream-tests STACK=alpha UP=demo CHECK=headers`" in lines[0]
    assert "patches/alpha/upstream-tests.verified.toml" in lines[0]
    # the same skip outside --changed is reported, not a failure (there is no record to vouch for)
    entries["demo/headers"].digest = _digest(demo)
    urec.save(demo.root, "alpha", entries)
    ok, out = _run(demo, capsys, changed=True)
    assert ok and "UNVERIFIED" not in out  # a matching record: nothing to run


def test_a_manual_check_is_reported_and_runs_only_by_name(env, capsys, monkeypatch):
    demo = _demo(env)
    checks = demo.root / "patches" / "alpha" / config.FILE
    _edit(checks, 'pytest = ["tests/unit"]', 'pytest = ["tests/unit"]\nmanual = "it starts a cluster"')
    ok, out = _run(demo, capsys, changed=True)
    assert ok, out
    assert "MANUAL, not run: unit (no matching record; it starts a cluster)" in out
    assert "demo/unit" not in urec.load(demo.root, "alpha")
    up = load_upstreams(demo.root)["demo"]
    spec = config.load("alpha", demo.root, load_upstreams(demo.root))["demo"]
    every = {
        c.check.name: c
        for c in run_upstream(
            up, spec, Path(sys.executable), env / "l", every=True, report=lambda *_: None
        ).checks
    }
    assert every["unit"].status == "manual" and not every["unit"].failed
    assert "it starts a cluster" in every["unit"].note and "CHECK=unit" in every["unit"].note
    named = run_upstream(
        up, spec, Path(sys.executable), env / "l2", every=True, only=["unit"], report=lambda *_: None
    )
    assert [c.status for c in named.checks] == ["ran"]
    _edit(checks, 'manual = "it starts a cluster"', 'manual = ""')
    with pytest.raises(UserError, match="`manual` must say why"):
        config.load("alpha", demo.root, None)
