"""The memory this process may use, for defaults sized by it (a storage node's segment, the
master's object table)."""

from __future__ import annotations

import os


def memory_limit() -> int:
    """The machine's memory, or its cgroup's limit when lower (a container's)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/sys/fs/cgroup/memory.max", "rb") as file:
            text = file.read(32).strip()
    except OSError:
        return physical
    return min(physical, int(text)) if text.isdigit() else physical  # else "max": none
