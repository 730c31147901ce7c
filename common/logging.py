"""structlog set-up shared by every kvpool process: JSON for machines, colours for people.

structlog is imported when a process first logs or configures logging, not when a module
asks for its logger: structlog loads rich with it, which costs a one-shot command such as
``kvpool get`` (which usually logs nothing) a large share of its run time.

kvpool is also a library (vLLM, SGLang and LMCache load its client). Where the process has
not configured structlog, kvpool's loggers do not use structlog's own default (every level,
debug included, printed on stdout, which is the application's output, or the object's bytes
of ``kvpool get KEY > file``): they write warnings and errors to stderr, and nothing else. That
default is kvpool's alone: importing kvpool never configures structlog for the application.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import structlog

LOG_FORMATS = ("auto", "json", "console")

#: The least level kvpool's loggers write where nothing configured structlog.
LIBRARY_LEVEL = logging.WARNING

#: A configuration that ``configure_logging_on_first_use`` put off: (format, numeric level).
_pending: tuple[str, int] | None = None
_pending_lock = threading.Lock()
#: A kvpool service configured logging itself (``configure_logging``): its loggers need not
#: ask at each line whether anyone did.
_service = False


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    """``auto`` picks console output on a terminal and JSON lines everywhere else; every
    line goes to stderr."""
    global _pending, _service
    checked = _checked(fmt, level)
    with _pending_lock:
        _pending = None  # (this one wins over one put off)
    _apply(*checked)
    _service = True


def configure_logging_on_first_use(fmt: str = "auto", level: str = "warning") -> None:
    """``configure_logging``, put off until a kvpool logger is first used: a one-shot command
    (``kvpool get``) usually logs nothing, and importing structlog would cost it a large share
    of its run time. The arguments are checked at once."""
    global _pending
    checked = _checked(fmt, level)
    with _pending_lock:
        _pending = checked


def _checked(fmt: str, level: str) -> tuple[str, int]:
    """(format, numeric level), or ValueError naming what is accepted."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {fmt!r}")
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}: use debug, info, warning or error")
    return fmt, numeric


def _apply(fmt: str, numeric: int, *, stderr_of_the_moment: bool = False) -> None:
    """Configures structlog. ``stderr_of_the_moment``: each line goes to ``sys.stderr`` as it
    is when written, not as it was now (a configuration put off until some call logs, in a
    process whose stderr a caller may swap and close later: a test's capture)."""
    import structlog

    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=(
            _standard_error if stderr_of_the_moment else structlog.PrintLoggerFactory(sys.stderr)
        ),
        cache_logger_on_first_use=True,
    )


def _apply_pending() -> None:
    """Applies the configuration put off, once (loggers of several threads may ask at once),
    unless structlog was configured since: by whoever runs the command in its own process (a
    test's ``capture_logs``), whose configuration is not kvpool's to replace."""
    import structlog

    global _pending
    with _pending_lock:
        if _pending is not None and not _configured(structlog):
            _apply(*_pending, stderr_of_the_moment=True)
        _pending = None  # (only now: a thread that logs meanwhile waits for the lock)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return cast("structlog.stdlib.BoundLogger", _DeferredLogger(name))


class _DeferredLogger:
    """Stands for ``structlog.get_logger(name)``, which it fetches (importing structlog) on
    first use; the logger it hands on follows the configuration of the moment, as structlog's
    own does, and is kvpool's library default (``_library_logger``) while structlog is not
    configured."""

    __slots__ = ("_logger", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._current(), attribute)

    def _current(self) -> Any:
        """Asked at each call: the application may configure structlog after kvpool's first
        line (and ``structlog.testing.capture_logs`` configures it for a while). Not in a
        kvpool service, which configured it (and logs on its request paths)."""
        if _service and self._logger is not None:
            return self._logger
        import structlog

        if _pending is not None:
            _apply_pending()
        if not _configured(structlog):
            return _library_logger()
        if self._logger is None:
            self._logger = structlog.get_logger(self._name)
        return self._logger


def _configured(structlog: Any) -> bool:
    """Whether someone configured structlog to write somewhere: not merely ``configure``d
    back to its built-in defaults (``structlog.testing.capture_logs`` does that as it ends),
    whose logger prints every level on stdout."""
    if not structlog.is_configured():
        return False
    config, builtin = structlog.get_config(), structlog._config
    return bool(
        config["logger_factory"] is not getattr(builtin, "_BUILTIN_DEFAULT_LOGGER_FACTORY", None)
        or config["wrapper_class"] is not getattr(builtin, "_BUILTIN_DEFAULT_WRAPPER_CLASS", None)
        or config["processors"] != getattr(builtin, "_BUILTIN_DEFAULT_PROCESSORS", None)
    )


@functools.cache
def _library_logger() -> Any:
    """What kvpool logs through where nothing configured structlog: warnings and errors, on
    stderr, in structlog's own console format (uncoloured off a terminal). An exception is
    a plain traceback: rich's would show each frame's local variables (a token, the caller's
    data) in the application's log."""
    import structlog

    return structlog.wrap_logger(
        _StandardError(),
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%Y-%m-%d %H:%M:%S", utc=False),
            structlog.dev.ConsoleRenderer(
                colors=sys.stderr.isatty(), exception_formatter=structlog.dev.plain_traceback
            ),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(LIBRARY_LEVEL),
        context_class=dict,
        cache_logger_on_first_use=True,
    )


def _standard_error(*_: Any) -> _StandardError:
    """structlog logger factory of ``_StandardError``s."""
    return _StandardError()


class _StandardError:
    """structlog's ``PrintLogger``, writing to the ``sys.stderr`` of the moment rather than the
    one of its creation: an application (or pytest) may replace ``sys.stderr`` later."""

    def msg(self, message: str) -> None:
        stream = sys.stderr
        if stream is None:  # (pythonw, or a daemon that closed it: nowhere to write)
            return
        stream.write(message + "\n")  # (one write: lines of two threads do not interleave)
        stream.flush()

    log = debug = info = warn = warning = error = critical = exception = fatal = failure = msg
