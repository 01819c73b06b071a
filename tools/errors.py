"""The base of every error a user can fix, and the one way a command line ends on it.

Each tool family subclasses UserError (WeightsError in tools.weights, ConvertError and SourceError in
tools.data, ...). Every CLI under tools/ ends through `run_cli`, so that they all exit alike:

    0    done
    1    the command ran and its verdict is no (a check or test found problems, a run failed)
    2    USER_ERROR: something the user must fix; one line `error: <what is wrong>`, then `  fix: <how>`
         when there is one, and no traceback (argparse's usage errors exit 2 too)
    3    MACHINE_FAULT: a fault of the machine or of a process (a worker or node lost, an engine error, a
         stall, a collective timeout, out of memory) that the restarts did not get past (`make train`,
         launch.restarts); `error: ...` and `  fix: ...` as for 2; the run resumes with the same command
    130  interrupted (Ctrl-C)
    143  stopped by SIGTERM, where a command turns it into `Stopped` (`make train`)

Anything else ends with Python's traceback: that is a bug of the project, not of the input.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from typing import NoReturn

USER_ERROR = 2
MACHINE_FAULT = 3
INTERRUPTED = 130
TERMINATED = 143


class Stopped(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that the same cleanup runs (`stop_on_sigterm`)."""


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM raises `Stopped` (default: the process dies at once, its children left
    running and its temporary files left behind); the handler before is restored after."""

    def raise_stopped(signum: int, frame: object) -> None:
        raise Stopped("SIGTERM")

    old = signal.signal(signal.SIGTERM, raise_stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


class UserError(Exception):
    """A problem with the user's input or tree. The message says what is wrong and how to fix it."""

    def __init__(self, message: str, *, fix: str | None = None):
        self.fix = fix
        super().__init__(message)

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text}\n  fix: {self.fix}" if self.fix else text


class MachineFault(UserError):
    """Not the user's input: a fault of the machine or of a process (exit MACHINE_FAULT). A UserError by
    kind only so that it prints alike (`error:`, `  fix:`)."""


def exit_status(main: Callable[..., int | None], *args: object) -> int:
    """Run `main(*args)` as a command line does: its status (None counts as 0); a UserError is printed
    to stderr as `error: <message>` (no traceback) and gives USER_ERROR, Ctrl-C gives INTERRUPTED."""
    try:
        return main(*args) or 0
    except MachineFault as e:
        print(f"error: {e}", file=sys.stderr)
        return MACHINE_FAULT
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return USER_ERROR
    except Stopped:
        print("stopped (SIGTERM)", file=sys.stderr)
        return TERMINATED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED


def run_cli(main: Callable[..., int | None], *args: object) -> NoReturn:
    """A CLI's `if __name__ == "__main__":` line: exit with `exit_status(main, *args)`."""
    sys.exit(exit_status(main, *args))
