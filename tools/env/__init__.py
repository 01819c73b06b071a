"""The Python environment: pip's index settings, a package-index client for source archives, hash locks.

Standard library only: bootstrap uses it before the virtual environment exists.
"""

from __future__ import annotations

import os
from pathlib import Path


def user_cache(*parts: str) -> Path:
    """ascend-r1's cache, shared by every checkout on the machine: $ASCEND_R1_CACHE, else
    $XDG_CACHE_HOME/ascend-r1, else ~/.cache/ascend-r1. Holds only verified, immutable things (source
    archives checked by sha256, the pinned uv)."""
    base = os.environ.get("ASCEND_R1_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ascend-r1"
    )
    return Path(base, *parts)
