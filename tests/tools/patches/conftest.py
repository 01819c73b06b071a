"""Fixtures of the patch manager's tests: demo projects in temporary folders."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_stack_from_the_shell(monkeypatch):
    """A demo project has its own stacks: a STACK= given to make for this checkout does not apply to it."""
    monkeypatch.delenv("ASCEND_R1_STACK", raising=False)
