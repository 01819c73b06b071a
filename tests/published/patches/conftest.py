"""Fixtures of the patch tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def restore_environ():
    """Code under test that writes os.environ itself (the DP-groups hook sets VLLM_DP_*): put it back."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
