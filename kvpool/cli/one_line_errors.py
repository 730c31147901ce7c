"""How the file-editing subcommands (``token``, ``quota``, ``capability-keys``) report what
they cannot do: one line, ``error: ...``, on stderr, and exit status 2; never a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from kvpool.cli.shown import message

Command = Callable[[argparse.Namespace], int]


class Refused(Exception):
    """A one-line error for the user: exit status 2."""


def one_line_errors(
    errors: Callable[[], tuple[type[Exception], ...]] = tuple,
) -> Callable[[Command], Command]:
    """Runs a command, reporting ``Refused`` and the exceptions ``errors()`` names as one line.
    ``errors`` is called only once one was raised: the modules that define them (the master's,
    say) are imported by the command that needs them, not by every ``kvpool`` call."""

    def decorate(command: Command) -> Command:
        def run(args: argparse.Namespace) -> int:
            try:
                return command(args)
            except Exception as error:
                if not isinstance(error, (Refused, *errors())):
                    raise
                print(f"error: {message(error)}", file=sys.stderr)
                return 2

        return run

    return decorate
