"""The one exception type the weight tools raise for problems a user can fix."""

from __future__ import annotations

from tools.errors import UserError


class WeightsError(UserError):
    """A user-facing error: the message names the file, the tensor or key, and what to do.

    The CLI prints it without a traceback and exits with status 2.
    """
