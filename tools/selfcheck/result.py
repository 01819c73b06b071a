"""One check's outcome."""

from __future__ import annotations

from dataclasses import dataclass

PASS, FAIL, NEEDS_NPU, SKIPPED = "pass", "FAIL", "needs NPU", "skipped"


@dataclass
class Result:
    check: str
    result: str
    figure: str


class CheckFailed(AssertionError):
    """A check ran and its figure is wrong."""
