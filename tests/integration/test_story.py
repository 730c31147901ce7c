"""`kvpool story KEY` on a real cluster: the master tells what happened to a key."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers import cluster_status

from kvpool import Client


def kvpool(*args: str, master: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvpool.cli.main", *args],
        capture_output=True,
        text=True,
        # Wide enough that the table keeps each event on one line.
        env={**os.environ, "KVPOOL_MASTER": master, "COLUMNS": "250"},
        timeout=60,
    )


def table_rows(text: str) -> list[list[str]]:
    """The cells of each row of a table rich printed (with its box drawn in Unicode or ASCII),
    a cell wrapped over several lines joined again."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in re.split(r"[│┃|]", line)][1:-1]
        if not cells:
            continue
        if rows and not cells[0]:  # the same row, continued
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells, strict=True)]
        else:
            rows.append(cells)
    return rows


@pytest.fixture(scope="module")
def master(shared_cluster) -> str:
    return shared_cluster.master_address


def test_kvpool_story_tells_a_real_objects_life(master):
    stored = kvpool("put", "told", "--value", "once", "--replicas", "2", master=master)
    assert stored.returncode == 0, stored.stderr
    assert kvpool("get", "told", master=master).returncode == 0
    assert kvpool("rm", "told", "--force", master=master).returncode == 0  # (read: leased)
    assert kvpool("put", "told", "--value", "twice", master=master).returncode == 0

    told = kvpool("story", "told", master=master)

    assert told.returncode == 0, told.stderr
    rows = table_rows(told.stdout)
    assert rows[0] == ["time", "ago", "event", "details"], told.stdout
    events = [row[2] for row in rows[1:]]
    assert events == [
        *("reserved", "committed", "published", "removed"),
        *("reserved", "committed", "published"),
    ], told.stdout
    put_ids = [re.match(r"put_id=(\d+)", row[3]) for row in rows[1:]]
    assert all(put_ids), "each event names its put first"
    assert len({m.group(1) for m in put_ids if m}) == 2, "two objects, one story"
    assert rows[1][3].count("@0x") == 2, "the first put reserved a buffer on each node"
    assert "force=yes" in rows[4][3] and "state=published" in rows[4][3]


def test_kvpool_story_of_an_unknown_key_fails_plainly(master):
    missing = kvpool("story", "never-written", master=master)

    assert missing.returncode == 1
    assert "no story of 'never-written'" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_client_story_names_the_nodes_segments(shared_cluster):
    with Client(shared_cluster.master_address, timeout=30) as client:
        client.put("asked", b"x" * 1000)
        client.remove("asked")
        story = client.story("asked")
        assert client.story("never-asked") == []

    assert [e.event for e in story] == ["reserved", "committed", "published", "removed"]
    assert story[-1].details["state"] == "published"
    assert story[-1].details["force"] == "no"
    [segment] = {r.split("@")[0] for r in story[0].details["replicas"].split(", ")}
    assert segment in {s.segment_id for s in client_segments(shared_cluster)}
    ages = [e.age_s for e in story]
    assert ages == sorted(ages, reverse=True) and ages[-1] >= 0


def client_segments(cluster):
    with Client(cluster.master_address, timeout=30) as client:
        return list(cluster_status(client.master).segments)
