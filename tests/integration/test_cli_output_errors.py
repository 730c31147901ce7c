"""The `kvpool` command where its output or its input is not what a shell usually gives it:
standard output on a full disk (`> /dev/full`), closed (`>&-`) or a pipe nobody reads, standard
input closed or endless, an output file it cannot open, a key file that is some other file.

Each ends in one line that says what is wrong and what to do, with the exit status saying it
failed; a reader that left on purpose (`| head`) ends quietly. Nothing is half done: a token
that could not be shown is not stored, and a file `get -o` could not open is not deleted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvpool.local_cluster import LocalCluster
from kvpool.security.identity import Role
from kvpool.security.tokens import CredentialStore, new_token

KVPOOL = str(Path(sys.executable).parent / "kvpool")

#: Standard output broken as a shell breaks it: (how, the redirection, the reason shown).
BROKEN_OUTPUTS = (
    ("full disk", ">/dev/full", "No space left on device"),
    ("closed", ">&-", "it is closed"),
)

#: Commands that print to standard output; a placeholder stands for a file they read.
PRINTING = (
    ("ls",),
    ("stat", "present"),
    ("status",),
    ("story", "present"),
    ("get", "present"),
    ("quota", "show", "--quotas", "QUOTAS"),
    ("token", "list", "--credentials", "CREDENTIALS"),
    ("capability-keys", "show", "KEYS"),
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One node of 32 MiB: a stream longer than its segment is cheap to send."""
    with LocalCluster(1, "32MiB", run_dir=tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


def kvpool(
    *args: str,
    cluster: LocalCluster | None = None,
    redirect: str = "",
    limit: str = "",
    **options: Any,
) -> subprocess.CompletedProcess[bytes]:
    """Runs `kvpool ARGS` as a client of ``cluster``. ``redirect`` (`>&-`) and ``limit`` (a
    `ulimit`) are applied by a shell first, as a user's would; stdout and stderr are captured
    where ``options`` do not say where they go."""
    env = dict(os.environ)
    if cluster is not None:
        env.update(cluster.client_env(), KVPOOL_MASTER=cluster.master_address)
    for stream in ("stdout", "stderr"):
        options.setdefault(stream, subprocess.PIPE)
    argv = [KVPOOL, *args]
    if redirect or limit:
        argv = ["sh", "-c", f'{limit}exec "$0" "$@" {redirect}', *argv]
    return subprocess.run(argv, env=env, timeout=120, **options)


def to_a_pipe_nobody_reads(*args: str, **options: Any) -> subprocess.CompletedProcess[bytes]:
    """`kvpool ARGS` writing to a pipe whose reader left (as `head` does): writes fail, EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return kvpool(*args, stdout=write_end, **options)
    finally:
        os.close(write_end)


def one_error_line(done: subprocess.CompletedProcess[bytes]) -> str:
    """The command's stderr, which must be one line, ``error: ...``."""
    text: str = done.stderr.decode()
    assert text.startswith("error: ") and text.count("\n") == 1, text
    return text


def credentials_file(path: Path) -> Path:
    """A credentials file with one token in it already."""
    CredentialStore.create(path).add(new_token("ops", Role.ADMIN)[1])
    return path


@pytest.fixture(scope="module")
def printing_args(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """The files the printing commands read, by the placeholder each stands for; and the key
    those about a key name."""
    assert kvpool("put", "present", "--value", "here", cluster=cluster).returncode == 0
    files = tmp_path_factory.mktemp("files")
    quotas, keys = files / "quotas.json", files / "capability-keys.json"
    made = kvpool("quota", "set", "--quotas", str(quotas), "--tenant", "a", "--objects", "5")
    assert made.returncode == 0, made.stderr
    assert kvpool("capability-keys", "create", str(keys)).returncode == 0
    credentials = credentials_file(files / "credentials.json")
    return {"QUOTAS": str(quotas), "CREDENTIALS": str(credentials), "KEYS": str(keys)}


@pytest.mark.parametrize(("how", "redirection", "reason"), BROKEN_OUTPUTS)
def test_token_create_whose_token_cannot_be_shown_does_not_store_it(
    tmp_path: Path, how: str, redirection: str, reason: str
) -> None:
    credentials = credentials_file(tmp_path / "credentials.json")
    before = credentials.read_bytes()
    done = kvpool(
        "token", "create", "--credentials", str(credentials), "--name", "y", "--role",
        "client", "--tenant", "t1", redirect=redirection,
    )  # fmt: skip
    assert credentials.read_bytes() == before, "a token nobody saw must not be valid"
    assert done.returncode == 1
    assert one_error_line(done).startswith(f"error: cannot write standard output: {reason}: ")
    assert "no token was made" in done.stderr.decode()


def test_token_create_to_a_pipe_nobody_reads_does_not_store_it(tmp_path: Path) -> None:
    """Not quiet, unlike a listing cut short: the token the user asked for was not made."""
    credentials = credentials_file(tmp_path / "credentials.json")
    before = credentials.read_bytes()
    done = to_a_pipe_nobody_reads(
        "token", "create", "--credentials", str(credentials), "--name", "y", "--role", "admin"
    )
    assert credentials.read_bytes() == before
    assert done.returncode == 1
    assert one_error_line(done).startswith("error: cannot write standard output: Broken pipe")


@pytest.mark.parametrize("command", PRINTING, ids=" ".join)
@pytest.mark.parametrize(("how", "redirection", "reason"), BROKEN_OUTPUTS)
def test_a_command_whose_output_cannot_be_written_does_say_so_in_one_line(
    cluster: LocalCluster,
    printing_args: dict[str, str],
    command: tuple[str, ...],
    how: str,
    redirection: str,
    reason: str,
) -> None:
    args = [printing_args.get(word, word) for word in command]
    done = kvpool(*args, cluster=cluster, redirect=redirection)
    assert done.returncode == 1, done.stderr
    assert one_error_line(done) == f"error: cannot write standard output: {reason}\n"


@pytest.mark.parametrize("command", PRINTING, ids=" ".join)
def test_a_command_whose_reader_left_does_end_quietly(
    cluster: LocalCluster, printing_args: dict[str, str], command: tuple[str, ...]
) -> None:
    """As `kvpool ls | head -1` does with many keys: the reader left, as it was asked to."""
    args = [printing_args.get(word, word) for word in command]
    done = to_a_pipe_nobody_reads(*args, cluster=cluster)
    assert done.returncode == 1, "its output was cut short: it did not succeed"
    assert done.stderr == b"", "not a traceback, nor Python's complaint at exit"


def test_get_to_a_file_it_cannot_open_does_not_delete_that_file(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """A running program's file cannot be opened for writing (ETXTBSY): the get wrote
    nothing there, and the program must stay."""
    assert kvpool("put", "small", "--value", "bytes", cluster=cluster).returncode == 0
    program = tmp_path / "program"
    shutil.copy("/bin/sleep", program)
    running = subprocess.Popen([str(program), "60"])
    try:
        done = kvpool("get", "small", "-o", str(program), cluster=cluster)
    finally:
        running.kill()
        running.wait()
    assert done.returncode == 1
    assert one_error_line(done) == f"error: cannot write {program}: Text file busy\n"
    assert program.read_bytes() == Path("/bin/sleep").read_bytes()


def test_put_with_standard_input_closed_does_say_to_give_a_file_or_a_value(
    cluster: LocalCluster,
) -> None:
    done = kvpool("put", "nothing", cluster=cluster, redirect="<&-")
    assert done.returncode == 1
    assert one_error_line(done) == (
        "error: standard input is closed: give a FILE to store, or --value TEXT\n"
    )


def test_put_of_a_device_does_refuse_it_before_reading(cluster: LocalCluster) -> None:
    """/dev/zero never ends: read whole, it would fill memory."""
    done = kvpool("put", "zeros", "/dev/zero", cluster=cluster, limit="ulimit -d 1048576; ")
    assert done.returncode == 1
    line = one_error_line(done)
    assert line.startswith("error: /dev/zero is a character device, not a file: "), line
    assert "`head -c SIZE /dev/zero | kvpool put KEY`" in line
    assert kvpool("stat", "zeros", cluster=cluster).returncode == 1, "nothing stored"


def test_put_of_an_endless_standard_input_does_stop_past_the_largest_object(
    cluster: LocalCluster,
) -> None:
    with open("/dev/zero", "rb") as zeros:
        done = kvpool("put", "zeros", cluster=cluster, stdin=zeros, limit="ulimit -d 1048576; ")
    assert done.returncode == 1
    assert one_error_line(done).startswith(
        "error: standard input holds more than 32.0 MiB, the most this cluster's storage "
        "could hold as one object: nothing was stored"
    )
    assert kvpool("stat", "zeros", cluster=cluster).returncode == 1


def test_put_of_a_file_larger_than_its_memory_does_say_so_in_one_line(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """A command limited to 1 GiB of memory, a (sparse) file of 3 GiB."""
    large = tmp_path / "large"
    with large.open("wb") as file:
        file.truncate(3 << 30)
    done = kvpool("put", "large", str(large), cluster=cluster, limit="ulimit -d 1048576; ")
    assert done.returncode == 1
    line = one_error_line(done)
    assert line.startswith(f"error: not enough memory to hold {large}: "), line


def test_capability_keys_show_of_another_json_file_does_name_the_missing_field(
    tmp_path: Path,
) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"not": "creds"}))
    done = kvpool("capability-keys", "show", str(other))
    assert done.returncode == 2
    line = one_error_line(done)
    assert line.startswith(f'error: capability key file {other}: it has no field "keys"'), line
    assert "If it is another file, give the key file's path" in line


def test_capability_keys_show_of_a_directory_does_ask_for_the_file_in_it(
    tmp_path: Path,
) -> None:
    done = kvpool("capability-keys", "show", str(tmp_path))
    assert done.returncode == 2
    assert one_error_line(done) == (
        f"error: capability key file {tmp_path} is a directory: give the path of the key file "
        f"itself (`kvpool capability-keys create {tmp_path}/capability-keys.json` makes one "
        "there)\n"
    )
    assert tmp_path.is_dir()
