"""Defaults sized by memory (the master's object table, a node's segment) follow a container's
limit on hosts with cgroup v2 and with cgroup v1 alike; before, a v1 host's limit was
ignored and a master with a 2 GiB limit sized its table for the whole host."""

import os

from kvpool.common.memory_limit import memory_limit

PHYSICAL = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_cgroup_v2_limit(tmp_path):
    (tmp_path / "memory.max").write_text(f"{2 << 30}\n")
    assert memory_limit(str(tmp_path), str(tmp_path / "none")) == min(PHYSICAL, 2 << 30)


def test_cgroup_v2_without_a_limit_is_the_machine(tmp_path):
    (tmp_path / "memory.max").write_text("max\n")
    assert memory_limit(str(tmp_path), str(tmp_path / "none")) == PHYSICAL


def test_cgroup_v1_limit(tmp_path):
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text(f"{1 << 30}\n")
    assert memory_limit(str(tmp_path), str(tmp_path / "none")) == min(PHYSICAL, 1 << 30)


def test_cgroup_v1_without_a_limit_is_the_machine(tmp_path):
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert memory_limit(str(tmp_path), str(tmp_path / "none")) == PHYSICAL


def test_no_cgroup_files_is_the_machine(tmp_path):
    assert memory_limit(str(tmp_path), str(tmp_path / "none")) == PHYSICAL


def test_a_limit_on_a_group_above_the_process_counts(tmp_path):
    """A pod's limit sits on the pod's group, the container's group below it has none."""
    pod = tmp_path / "kubepods" / "pod1"
    (pod / "container").mkdir(parents=True)
    (pod / "memory.max").write_text(f"{3 << 30}\n")
    (pod / "container" / "memory.max").write_text("max\n")
    own = tmp_path / "self_cgroup"
    own.write_text("0::/kubepods/pod1/container\n")
    assert memory_limit(str(tmp_path), str(own)) == min(PHYSICAL, 3 << 30)


def test_the_lowest_limit_on_the_way_up_wins(tmp_path):
    group = tmp_path / "memory" / "docker" / "abc"
    group.mkdir(parents=True)
    (tmp_path / "memory" / "docker" / "memory.limit_in_bytes").write_text(f"{1 << 30}\n")
    (group / "memory.limit_in_bytes").write_text(f"{4 << 30}\n")
    own = tmp_path / "self_cgroup"
    own.write_text("12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n")
    assert memory_limit(str(tmp_path), str(own)) == min(PHYSICAL, 1 << 30)


def test_a_group_the_mount_does_not_show_falls_back_to_the_mounts_root(tmp_path):
    """A container without a cgroup namespace: /proc/self/cgroup names the host's path,
    its own group is mounted at the root."""
    (tmp_path / "memory.max").write_text(f"{2 << 30}\n")
    own = tmp_path / "self_cgroup"
    own.write_text("0::/system.slice/docker-abc.scope\n")
    assert memory_limit(str(tmp_path), str(own)) == min(PHYSICAL, 2 << 30)
