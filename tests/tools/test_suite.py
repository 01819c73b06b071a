"""tools/suite.py: a failed `make test` ends with the failed tests and the first line of each failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tools.suite import failures

FAILING = """
import pytest

def test_passes():
    pass

def test_fails():
    assert 1 == 2, "the learning guard did not rise"

@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")

def test_errors(broken):
    pass
"""


def test_failures_names_each_failed_test_with_its_first_line(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(FAILING)
    junit = tmp_path / "junit.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", "test_sample.py"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout
    lines = failures(junit)
    assert len(lines) == 2, lines
    assert lines[0].startswith("test_sample::test_fails: ") and "the learning guard did not rise" in lines[0]
    assert lines[1].startswith("test_sample::test_errors: ") and "fixture broke" in lines[1]
    assert failures(tmp_path / "absent.xml") == []
