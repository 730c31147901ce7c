"""Where a persistent segment's files live: ``DIR/segment.data`` and ``DIR/segment.index`` in
a directory of its own, created mode 0700 and refused when other users could write it (see
private_files):

* NVMe (``--nvme PATH``): ``PATH/kvpool-nvme/``;
* DRAM in /dev/shm (``--dram-shm``): ``SHM_DIR/kvpool-NAME-dram/``, NAME being the
  ``--node-id`` given, else the host name.

kvpool before this layout kept the two files beside that directory, as ``DIR.data`` and
``DIR.index`` (in /dev/shm, a directory every user can write): a node moves its own files of
that layout in when it first starts, so that it finds its objects again.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from kvpool.common.logging import get_logger
from kvpool.storage_node.private_files import make_private_directory
from kvpool.storage_node.segment import DATA_SUFFIX, INDEX_SUFFIX

log = get_logger("kvpool.node")

BASE_NAME = "segment"


def nvme_directory(path: str) -> Path:
    return Path(path) / "kvpool-nvme"


def shm_directory(shm_dir: str, name: str) -> Path:
    return Path(shm_dir) / f"kvpool-{name.replace('/', '_')}-dram"


def segment_base(directory: Path) -> Path:
    """Makes (or checks) ``directory`` and returns the base of its segment's files."""
    make_private_directory(directory)
    base = directory / BASE_NAME
    _move_in_earlier_files(directory, base)
    return base


def _move_in_earlier_files(directory: Path, base: Path) -> None:
    old_index = directory.with_name(directory.name + INDEX_SUFFIX)
    new_index = base.with_name(base.name + INDEX_SUFFIX)
    if os.path.lexists(new_index) or not _own_file(old_index):
        return
    old_data = directory.with_name(directory.name + DATA_SUFFIX)
    if _own_file(old_data):
        os.replace(old_data, base.with_name(base.name + DATA_SUFFIX))
    os.replace(old_index, new_index)  # last: until it moves, the move is still to do
    log.info("segment files moved into their own directory", directory=str(directory))


def _own_file(path: Path) -> bool:
    """A regular file (not a link) of this user: one this node wrote."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()
