"""From a shell: `kvpool up` in one terminal, put/get/ls/rm/status in another, with the
credentials `kvpool up` wrote (`source RUN/client.env`, `source RUN/admin.env`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from helpers import sourced

#: What `source client.env` / `source admin.env` of the running `kvpool up` would export.
UP_ENV: dict[str, dict[str, str]] = {"client": {}, "admin": {}}


def kvpool(
    *args: str, master: str, stdin: bytes | None = None, role: str = "client"
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvpool.cli.main", *args],
        input=stdin,
        capture_output=True,
        env={**os.environ, **UP_ENV[role], "KVPOOL_MASTER": master},
        timeout=60,
    )


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("up")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvpool.cli.main",
            "up",
            "--nodes",
            "2",
            "--dram",
            "64MiB",
            "--port",
            "0",
            "--run-dir",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    master = None
    deadline = time.monotonic() + 60
    while master is None and time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("kvpool master at "):
            master = line.split()[-1]
    assert master, "".join(lines)
    UP_ENV["client"] = sourced(run_dir / "client.env")
    UP_ENV["admin"] = sourced(run_dir / "admin.env")
    assert UP_ENV["client"]["KVPOOL_MASTER"] == master
    yield process, master
    if process.poll() is None:
        process.kill()
        process.wait()


def test_put_get_ls_rm_status_against_kvpool_up(up, tmp_path):
    _, master = up
    stored = kvpool("put", "greeting", "--value", "hello kvpool", master=master)
    assert stored.returncode == 0, stored.stderr
    payload = os.urandom(100_000)
    source = tmp_path / "blob.bin"
    source.write_bytes(payload)
    assert kvpool("put", "blob", str(source), master=master).returncode == 0
    assert kvpool("put", "piped", master=master, stdin=b"from stdin").returncode == 0

    got = kvpool("get", "greeting", master=master)
    assert got.returncode == 0 and got.stdout == b"hello kvpool"
    target = tmp_path / "out.bin"
    assert kvpool("get", "blob", "-o", str(target), master=master).returncode == 0
    assert target.read_bytes() == payload
    assert kvpool("get", "piped", master=master).stdout == b"from stdin"

    listing = kvpool("ls", master=master)
    assert listing.returncode == 0
    for key in (b"greeting", b"blob", b"piped"):
        assert key in listing.stdout
    assert b"greeting" not in kvpool("ls", "--prefix", "bl", master=master).stdout

    totals = kvpool("status", master=master)  # a client of one tenant: totals, its objects
    assert totals.returncode == 0 and b"3 object(s) of this tenant" in totals.stdout
    assert b"node0" not in totals.stdout, "no topology for a tenant's client"
    assert b"objects" not in totals.stdout, "no count per tier (it would be every tenant's)"
    assert b"dram" in totals.stdout
    status = kvpool("status", master=master, role="admin")
    assert status.returncode == 0
    assert b"2 node(s), 3 object(s)" in status.stdout

    removed = kvpool("rm", "greeting", "--force", master=master)
    assert removed.returncode == 0, removed.stderr
    missing = kvpool("get", "greeting", master=master)
    assert missing.returncode == 1
    assert b"no object with key 'greeting'" in missing.stderr
    assert b"Traceback" not in missing.stderr


def test_stat_and_removal_by_prefix_from_the_shell(up):
    _, master = up
    for key in ("logs/a", "logs/b", "keep/c"):
        assert kvpool("put", key, "--value", key, master=master).returncode == 0
    stat = kvpool("stat", "logs/a", master=master)
    assert stat.returncode == 0, stat.stderr
    for field in (b"size", b"published", b"replica", b"dram"):
        assert field in stat.stdout
    removed = kvpool("rm", "--prefix", "logs/", master=master)
    assert removed.returncode == 0 and b"removed 2 object(s)" in removed.stderr
    assert kvpool("get", "logs/a", master=master).returncode == 1
    assert kvpool("get", "keep/c", master=master).stdout == b"keep/c"
    missing = kvpool("stat", "logs/b", master=master)
    assert missing.returncode == 1 and b"no object with key" in missing.stderr


def test_output_that_cannot_be_written_is_one_line_not_a_traceback(up, tmp_path):
    _, master = up
    assert kvpool("put", "big", stdin=os.urandom(1 << 20), master=master).returncode == 0
    unwritable = kvpool("get", "big", "-o", str(tmp_path / "no-such-dir" / "out"), master=master)
    assert unwritable.returncode == 1
    assert b"error: cannot write" in unwritable.stderr
    assert b"Traceback" not in unwritable.stderr
    full = kvpool("get", "big", "-o", "/dev/full", master=master)  # (every write: ENOSPC)
    assert full.returncode == 1
    assert full.stderr == b"error: cannot write /dev/full: No space left on device\n"


def test_output_to_a_reader_that_stops_early_ends_quietly(up):
    """As `kvpool get big | head -c 10` does: the pipe closes under the command's output."""
    _, master = up
    assert kvpool("put", "long", stdin=os.urandom(1 << 20), master=master).returncode == 0
    reader = subprocess.Popen(
        [sys.executable, "-m", "kvpool.cli.main", "get", "long"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **UP_ENV["client"], "KVPOOL_MASTER": master},
    )
    assert reader.stdout is not None
    reader.stdout.read(10)
    reader.stdout.close()  # (more than a pipe holds is still to come: its write fails)
    _, errors = reader.communicate(timeout=60)
    assert reader.returncode == 1, "a get whose output was cut short did not succeed"
    assert errors == b"", "not a traceback, nor Python's complaint at exit"


def test_bench_prints_put_and_get_throughput_of_a_running_cluster(up):
    _, master = up
    done = kvpool("bench", "--sizes", "64KiB,1MiB", "--bytes", "4MiB", master=master)
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout.decode()
    assert "put GB/s" in out and "get GB/s" in out
    assert "64.0 KiB" in out and "1.0 MiB" in out


def test_bench_on_a_cluster_too_small_for_its_objects_says_what_to_change():
    bench = ["bench", "--nodes", "1", "--dram", "32MiB", "--sizes", "4MiB", "--bytes", "64MiB"]
    done = subprocess.run(
        [sys.executable, "-m", "kvpool.cli.main", *bench],
        capture_output=True,
        timeout=120,
    )
    assert done.returncode != 0
    err = done.stderr.decode()
    assert "raise --dram" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["drain", "--timeout", "inf", "n1"], "argument --timeout: must be a number of seconds"),
        (["drain", "--timeout", "1", "n\udcff"], "is not valid text"),
        (["ls", "--limit", "-1"], "argument --limit: must be a whole number from 0"),
        (["ls", "--prefix", "\udcff"], "prefix"),
        (["rm", "--prefix", ""], "an empty --prefix would remove everything: pass --all"),
        (["get", "--timeout", "nan", "k"], "argument --timeout"),
    ],
)
def test_bad_client_command_arguments_exit_2_with_one_line(args, message):
    """(Each would have hung, printed a traceback, or done something else than asked.)"""
    args = [os.fsencode(a) if "\udcff" in a else a for a in args]
    result = kvpool(*args, master="127.0.0.1:1")
    assert result.returncode == 2, result.stderr
    err = result.stderr.decode(errors="replace")
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--dram-bytes", "1.5", "not a whole number of bytes"),
        ("--dram-bytes", "9" * 400, "too large a size"),
        ("--objects", "\u00b2", "is not a whole number from 0 to"),
        ("--objects", str(2**64), "is not a whole number from 0 to"),
        ("--objects", "9" * 5000, "is not a whole number from 0 to"),
        ("--dram-bytes", "9" * 5000, "too large a size"),
    ],
)
def test_quota_values_that_are_not_whole_numbers_the_master_counts_are_refused(
    tmp_path, flag, value, message
):
    quotas = tmp_path / "quotas.json"
    result = kvpool(
        "quota", "set", "--quotas", str(quotas), "--tenant", "t", flag, value, master="unused:1"
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr.decode() and not quotas.exists()


def test_client_commands_report_an_unreachable_master_without_a_traceback():
    result = kvpool("status", "--timeout", "0.5", master="127.0.0.1:1")
    assert result.returncode == 1
    assert b"did not answer" in result.stderr and b"Traceback" not in result.stderr


@pytest.mark.parametrize("flag", ["--port", "--lane-port", "--http-port"])
def test_a_master_whose_port_is_taken_says_which_and_exits(flag):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = {"--port": "0", "--lane-port": "0", "--http-port": "0"}
        ports[flag] = str(taken.getsockname()[1])
        done = subprocess.run(
            [sys.executable, "-m", "kvpool.cli.main", "master", "--host", "127.0.0.1",
             "--insecure", *[item for pair in ports.items() for item in pair]],
            capture_output=True,
            timeout=60,
        )  # fmt: skip
    assert done.returncode == 2
    err = done.stderr.decode() + done.stdout.decode()
    assert f"Pick another port with {flag}" in err and "Traceback" not in err


#: Keys a peer could choose that Rich would take for markup or an emoji, or that carry
#: what a terminal obeys (an escape sequence, a newline faking a row, a bidi override).
ODD_KEYS = {
    "odd/x[/]": b"odd/x[/]",
    "odd/[link=http://example.com]hidden[/link]": b"odd/[link=http://example.com]hidden[/link]",
    "odd/[bold red]loud": b"odd/[bold red]loud",
    "odd/:smile:": b"odd/:smile:",
    "odd/esc\x1b]0;retitled\x07": rb"'odd/esc\x1b]0;retitled\x07'",
    "odd/two\nrows": rb"'odd/two\nrows'",
    "odd/bidi\u202egnp.exe": rb"'odd/bidi\u202egnp.exe'",
}


def test_keys_and_what_peers_say_are_shown_as_data_never_as_markup_or_escapes(up):
    _, master = up
    for key in ODD_KEYS:
        stored = kvpool("put", key, "--value", "v", master=master)
        assert stored.returncode == 0, stored.stderr
    listing = kvpool("ls", "--prefix", "odd/", master=master)
    assert listing.returncode == 0, listing.stderr
    assert b"Traceback" not in listing.stderr and b"MarkupError" not in listing.stderr
    assert listing.stdout.count(b"\n") == len(ODD_KEYS) + 1, "a header, then one row per key"
    assert b"7 key(s)" in listing.stderr
    for shown in ODD_KEYS.values():
        assert shown in listing.stdout, (shown, listing.stdout)
    # an admin lists every tenant's keys (TENANT/KEY): from the whole listing, theirs
    everything = kvpool("ls", master=master, role="admin")
    assert everything.returncode == 0, everything.stderr
    assert b"MarkupError" not in everything.stderr
    for shown in ODD_KEYS.values():
        assert shown.lstrip(b"'") in everything.stdout, (shown, everything.stdout)
    for output in (listing.stdout, everything.stdout):
        assert b"\x1b" not in output and b"\x07" not in output, "no raw escape sequence"
        assert "\u202e".encode() not in output, "no raw bidi override"
        assert "😄".encode() not in output, "no emoji made of a key"
    for key, shown in ODD_KEYS.items():
        stat = kvpool("stat", key, master=master)
        assert stat.returncode == 0, stat.stderr
        assert b"key      " + shown + b"\n" in stat.stdout, stat.stdout
        assert b"\x1b" not in stat.stdout
        story = kvpool("story", key, master=master)
        assert story.returncode == 0, story.stderr
        assert b"published" in story.stdout and b"\x1b" not in story.stdout
    removed = kvpool("rm", "--prefix", "odd/", master=master)
    assert removed.returncode == 0 and b"removed 7 object(s)" in removed.stderr


def test_ctrl_c_stops_kvpool_up_cleanly(up):
    process, _ = up
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    assert "stopped" in output
