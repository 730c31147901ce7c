"""structlog set-up shared by every kvpool process: JSON for machines, colours for people.

structlog is imported when a process first logs or configures logging, not when a module
asks for its logger: structlog loads rich with it, which costs a one-shot command such as
``kvpool get`` (which usually logs nothing) a large share of its run time.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import structlog

LOG_FORMATS = ("auto", "json", "console")


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    """``auto`` picks console output on a terminal and JSON lines everywhere else."""
    import structlog

    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {fmt!r}")
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}: use debug, info, warning or error")
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
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return cast("structlog.stdlib.BoundLogger", _DeferredLogger(name))


class _DeferredLogger:
    """Stands for ``structlog.get_logger(name)``, which it fetches (importing structlog) on
    first use; the logger it hands on follows the configuration of the moment, as structlog's
    own does."""

    __slots__ = ("_logger", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, attribute: str) -> Any:
        if self._logger is None:
            import structlog

            self._logger = structlog.get_logger(self._name)
        return getattr(self._logger, attribute)
