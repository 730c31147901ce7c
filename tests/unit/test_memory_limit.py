"""Defaults sized by memory (the master's object table, a node's segment) follow a container's
limit on hosts with cgroup v2 and with cgroup v1 alike; before, a v1 host's limit was
ignored and a master with a 2 GiB limit sized its table for the whole host."""

import os

from kvpool.common.memory_limit import memory_limit

PHYSICAL = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_cgroup_v2_limit(tmp_path):
    (tmp_path / "memory.max").write_text(f"{2 << 30}\n")
    assert memory_limit(str(tmp_path)) == min(PHYSICAL, 2 << 30)


def test_cgroup_v2_without_a_limit_is_the_machine(tmp_path):
    (tmp_path / "memory.max").write_text("max\n")
    assert memory_limit(str(tmp_path)) == PHYSICAL


def test_cgroup_v1_limit(tmp_path):
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text(f"{1 << 30}\n")
    assert memory_limit(str(tmp_path)) == min(PHYSICAL, 1 << 30)


def test_cgroup_v1_without_a_limit_is_the_machine(tmp_path):
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert memory_limit(str(tmp_path)) == PHYSICAL


def test_no_cgroup_files_is_the_machine(tmp_path):
    assert memory_limit(str(tmp_path)) == PHYSICAL
