"""The memory this process may use, for defaults sized by it (a storage node's segment, the
master's object table).

A limit can sit on the process's own cgroup or on any group above it (a pod's limit on the
pod's group, the container's own below it), so every group from the process's up to the
root counts, and the lowest limit wins. The process's group is read from
``/proc/self/cgroup``; where that names a path the mount does not show (a container without
a cgroup namespace sees the host's path but its own group mounted at the root), the groups
that do exist on the way up still count, the mount's root among them."""

from __future__ import annotations

import os

#: cgroup v2's limit file (in each group) and cgroup v1's (under the memory controller's
#: mount; there an unlimited group reads as a number near 2**63).
V2_LIMIT, V1_CONTROLLER, V1_LIMIT = "memory.max", "memory", "memory.limit_in_bytes"


def memory_limit(
    cgroup_root: str = "/sys/fs/cgroup", self_cgroup: str = "/proc/self/cgroup"
) -> int:
    """The machine's memory, or the lowest cgroup limit over this process when lower."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    v2_path, v1_path = _own_groups(self_cgroup)
    limits = [physical]
    limits += _limits_up(cgroup_root, v2_path, V2_LIMIT)
    limits += _limits_up(os.path.join(cgroup_root, V1_CONTROLLER), v1_path, V1_LIMIT)
    return min(limits)


def _own_groups(self_cgroup: str) -> tuple[str, str]:
    """This process's cgroup v2 path and cgroup v1 memory path ("/" where not named)."""
    v2 = v1 = "/"
    try:
        with open(self_cgroup, encoding="utf-8", errors="replace") as file:
            lines = file.read(65536).splitlines()
    except OSError:
        return v2, v1
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        if fields[0] == "0" and fields[1] == "":
            v2 = fields[2] or "/"
        elif V1_CONTROLLER in fields[1].split(","):
            v1 = fields[2] or "/"
    return v2, v1


def _limits_up(mount: str, group: str, name: str) -> list[int]:
    """The limits in ``name`` files from ``group`` (under ``mount``) up to the mount's root;
    a group the mount does not show, or a file that says no limit, adds none."""
    limits = []
    parts = [part for part in group.split("/") if part and part not in (".", "..")]
    for depth in range(len(parts), -1, -1):
        path = os.path.join(mount, *parts[:depth], name)
        try:
            with open(path, "rb") as file:
                text = file.read(32).strip()
        except OSError:
            continue
        if text.isdigit():  # (else "max": no limit)
            limits.append(int(text))
    return limits
