"""How the file-editing subcommands (``token``, ``quota``, ``capability-keys``) report what
they cannot do: one line, ``error: ...``, on stderr, and exit status 2; never a traceback.

Standard output is theirs and the client commands' alike (``guarded_stdout``): a command's
output that cannot be written (a full disk, ``> /dev/full``, a closed descriptor, ``>&-``) is
one line too, ``error: cannot write standard output: REASON``, and exit status 1; output to a
reader that left early (``kvpool ls | head -1``) ends quietly, with exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, TextIO, cast

from kvpool.cli.shown import message

Command = Callable[[argparse.Namespace], int]


class Refused(Exception):
    """A one-line error for the user: exit status 2 (``status``, where another is meant)."""

    def __init__(self, text: str, *, status: int = 2) -> None:
        super().__init__(text)
        self.status = status


class OutputFailed(Exception):
    """Standard output could not be written: ``reason`` says why (an ``errno`` where the
    system gave one). Not an OSError: a command's ``except OSError`` about its own files must
    never take the output's failure for theirs and report it as a file's."""

    def __init__(self, reason: str, code: int | None = None) -> None:
        super().__init__(f"cannot write standard output: {reason}")
        self.reason = reason
        self.errno = code

    @property
    def reader_left(self) -> bool:
        """The output went to a pipe whose reader stopped reading, as ``head`` does: what the
        user asked for, so no error to show."""
        return self.errno == errno.EPIPE


class _GuardedOutput:
    """``sys.stdout`` while a command runs: each write and flush that fails raises
    ``OutputFailed``, and so does any write where Python started with no standard output
    (``>&-``: ``sys.stdout`` is None, and ``print`` would drop the output without a word).
    Everything else (``isatty``, ``encoding``, ...) is the stream's own."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream
        self.failed = False

    def _open(self) -> TextIO:
        if self._stream is None:
            self.failed = True
            raise OutputFailed("it is closed", errno.EBADF)
        return self._stream

    def _failure(self, error: OSError) -> OutputFailed:
        self.failed = True
        return OutputFailed(error.strerror or str(error), error.errno)

    def write(self, text: str) -> int:
        stream = self._open()
        try:
            return stream.write(text)
        except OSError as error:
            raise self._failure(error) from None

    def flush(self) -> None:
        if self._stream is None:
            return  # (nothing was written: nothing is lost)
        try:
            self._stream.flush()
        except OSError as error:
            raise self._failure(error) from None

    def fileno(self) -> int:
        return self._open().fileno()

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_stdout() -> Iterator[None]:
    """Runs a command with ``sys.stdout`` guarded (``_GuardedOutput``), flushed at the end:
    output to a file is buffered, and a full disk shows only when it is flushed, which
    without this would be at exit, where Python reports it with a traceback after the
    command has already succeeded. After a failure, the descriptor is pointed at
    /dev/null: what is still buffered would fail again at exit, with Python's own message."""
    saved = sys.stdout
    guard = _GuardedOutput(saved)
    sys.stdout = cast(TextIO, guard)
    try:
        yield
    except BaseException:
        with contextlib.suppress(OutputFailed):  # (the command's own error is the one to tell)
            guard.flush()
        raise
    else:
        guard.flush()
    finally:
        sys.stdout = saved
        if guard.failed and saved is not None:  # (None: descriptor 1 may be another file's)
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, saved.fileno())
                os.close(devnull)


def output_failed(error: OutputFailed) -> int:
    """Reports ``error`` as one line (none for a reader that left): exit status 1."""
    if not error.reader_left:
        print(f"error: {message(error)}", file=sys.stderr)
    return 1


def one_line_errors(
    errors: Callable[[], tuple[type[Exception], ...]] = tuple,
) -> Callable[[Command], Command]:
    """Runs a command, reporting ``Refused`` and the exceptions ``errors()`` names as one line.
    ``errors`` is called only once one was raised: the modules that define them (the master's,
    say) are imported by the command that needs them, not by every ``kvpool`` call."""

    def decorate(command: Command) -> Command:
        def run(args: argparse.Namespace) -> int:
            try:
                with guarded_stdout():
                    return command(args)
            except OutputFailed as error:
                return output_failed(error)
            except Exception as error:
                if not isinstance(error, (Refused, *errors())):
                    raise
                print(f"error: {message(error)}", file=sys.stderr)
                return error.status if isinstance(error, Refused) else 2

        return run

    return decorate
