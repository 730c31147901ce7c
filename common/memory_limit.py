"""The memory this process may use, for defaults sized by it (a storage node's segment, the
master's object table)."""

from __future__ import annotations

import os

#: Where a container's memory limit is read: cgroup v2's file, then cgroup v1's (Kubernetes
#: still runs on hosts with v1; there an unlimited group reads as a number near 2**63).
LIMIT_FILES = ("memory.max", "memory/memory.limit_in_bytes")


def memory_limit(cgroup_root: str = "/sys/fs/cgroup") -> int:
    """The machine's memory, or its cgroup's limit when lower (a container's)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for name in LIMIT_FILES:
        try:
            with open(os.path.join(cgroup_root, name), "rb") as file:
                text = file.read(32).strip()
        except OSError:
            continue
        return min(physical, int(text)) if text.isdigit() else physical  # else "max": none
    return physical
