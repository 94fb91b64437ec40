"""Exit statuses every task shares: 2 when the command line itself is wrong (as invoke's and
argparse's parse errors), 1 when a valid command was refused or failed.

A module marks its option-value errors by raising a subclass of both its own error and
UsageError (`class FlashUsageError(FlashError, UsageError)`); tasks.py maps the exit status
from that, so the split is decided where the error is raised."""

from __future__ import annotations

EXIT_USAGE = 2
EXIT_REFUSED = 1


class UsageError(Exception):
    """An option value or combination no host state could make right; the message names it
    and the fix."""


def exit_status(error: BaseException) -> int:
    return EXIT_USAGE if isinstance(error, UsageError) else EXIT_REFUSED
