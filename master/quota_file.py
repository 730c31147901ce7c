"""The quotas file (``kvpool master --quotas FILE``): read at start, read again when it changes.

The I/O side of quotas.py, in the way tokens.py's CredentialStore reads the credentials file:
the file is looked at once a second at most (a stat), and read only when it changed (inode,
modification time, size). A file missing or malformed at start is a startup error; later, it
is a warning, once per version of the file, and the quotas last read stay in force (a botched
edit changes nothing).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from kvpool.common.logging import get_logger
from kvpool.master.quotas import Quotas

log = get_logger("kvpool.master")

#: How often (seconds) the file is looked at again, at most.
CHECK_INTERVAL = 1.0
#: The signature of a file that is not there.
MISSING = (-1, -1, -1)


class QuotaFileError(ValueError):
    """The quotas file cannot be used; the message says what to fix."""


def read_quotas(path: str | Path) -> Quotas:
    """The quotas the file holds now; QuotaFileError saying what is wrong."""
    return _parse(_read(Path(path))[0], Path(path))


def _read(path: Path) -> tuple[bytes, os.stat_result]:
    try:
        with path.open("rb") as file:
            return file.read(), os.fstat(file.fileno())
    except FileNotFoundError:
        raise QuotaFileError(
            f"quotas file {path} does not exist: create it with `kvpool quota set --quotas "
            f"{path} --tenant TENANT ...`"
        ) from None
    except OSError as error:
        raise QuotaFileError(f"cannot read quotas file {path}: {error.strerror}") from None


def _parse(data: bytes, path: Path) -> Quotas:
    """The quotas of the file's bytes; QuotaFileError whatever is wrong with them: anything
    else (a RecursionError of deeply nested JSON, an OverflowError) would crash a start, or
    escape ``QuotaFile.current`` into the master's serving loop."""
    try:
        content = json.loads(data)
    except RecursionError:
        raise QuotaFileError(f"quotas file {path} is not JSON: nested too deeply to read") from None
    except Exception as error:
        raise QuotaFileError(f"quotas file {path} is not JSON: {error}") from None
    try:
        return Quotas.from_json(content, f"quotas file {path}")
    except ValueError as error:
        raise QuotaFileError(str(error)) from None
    except Exception as error:
        raise QuotaFileError(
            f"quotas file {path} is not a usable quotas file: {type(error).__name__}: {error}"
        ) from None


def _signature(stat: os.stat_result) -> tuple[int, int, int]:
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


class QuotaFile:
    """The quotas of a file as it is now (within ``check_interval`` seconds)."""

    def __init__(self, path: str | Path, *, check_interval: float = CHECK_INTERVAL) -> None:
        """QuotaFileError when the file is missing or malformed."""
        self.path = Path(path)
        self._check_interval = check_interval
        data, stat = _read(self.path)
        self.quotas = _parse(data, self.path)
        self._signature = _signature(stat)
        self._refused: tuple[int, int, int] | None = None
        self._checked = time.monotonic()

    def current(self) -> Quotas:
        """The quotas in force: the file's if it changed and is good, else the last good
        (whatever went wrong reading it: this runs in the master's serving loop)."""
        now = time.monotonic()
        if now - self._checked < self._check_interval:
            return self.quotas
        self._checked = now
        try:
            seen = _signature(self.path.stat())
        except OSError:
            seen = MISSING
        if seen in (self._signature, self._refused):
            return self.quotas
        try:
            data, stat = _read(self.path)
            quotas = _parse(data, self.path)
        except Exception as error:  # (never into the serving loop that asked)
            log.warning(
                "quotas file unusable; still using the quotas read from it before",
                path=str(self.path),
                error=str(error),
            )
            self._refused = seen  # warned once per version of the file
            return self.quotas
        self.quotas, self._signature, self._refused = quotas, _signature(stat), None
        log.info("quotas read again", path=str(self.path), tenants=len(quotas.tenants))
        return quotas
