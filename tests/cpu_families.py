"""Tests that need a CPU family (tools/cpu_kernels.py): skipped, naming the missing flag, on other CPUs,
never passed without running."""

from __future__ import annotations

import pytest

from tools.cpu_kernels import cpu_flags, family


def requires_cpu(*flags: str):
    """A skip mark for a CPU without every one of `flags` (/proc/cpuinfo), naming what is missing."""
    have = cpu_flags()
    missing = [f for f in flags if f not in have]
    return pytest.mark.skipif(
        bool(missing),
        reason=f"needs CPU flag {' and '.join(missing)} (this CPU: family {family(have)})",
    )
