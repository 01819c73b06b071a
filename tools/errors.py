"""The base of every error a user can fix: the CLIs print it without a traceback, with what to do.

Each tool family subclasses it (WeightsError in tools.weights, ConvertError and SourceError in tools.data).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn


class UserError(Exception):
    """A problem with the user's input or tree. The message says what is wrong and how to fix it."""

    def __init__(self, message: str, *, fix: str | None = None):
        self.fix = fix
        super().__init__(message)

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text}\n  fix: {self.fix}" if self.fix else text


def run_cli(main: Callable[[], int]) -> NoReturn:
    """A CLI's `if __name__ == "__main__"`: exit with main's status; a UserError is printed as
    `error: <message>` (no traceback) and exits 2."""
    try:
        sys.exit(main())
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
