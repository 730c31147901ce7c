"""`kvpool token create/list/revoke` from a shell: a token printed once, a file of hashes,
one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvpool.security.identity import Identity, Role
from kvpool.security.tokens import CredentialStore, token_problem

KVPOOL = str(Path(sys.executable).parent / "kvpool")


def kvpool(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "KVPOOL_CREDENTIALS"}
    return subprocess.run(
        [KVPOOL, "token", *args],
        capture_output=True,
        text=True,
        env={**environment, **(env or {})},
        timeout=60,
    )


@pytest.fixture
def credentials(tmp_path: Path) -> Path:
    return tmp_path / "credentials.json"


def create(credentials: Path, *args: str) -> str:
    done = kvpool("create", "--credentials", str(credentials), *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_create_prints_the_token_alone_once_and_makes_the_file(credentials):
    done = kvpool(
        "create", "--credentials", str(credentials), "--name", "alice", "--role", "client",
        "--tenant", "acme",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [token] = done.stdout.splitlines()  # `> alice.token` keeps just the token
    assert token_problem(token) is None
    assert "shown this once" in done.stderr and f"created credentials file {credentials}" in (
        done.stderr
    )
    assert token.split(".")[2] not in credentials.read_text()
    assert oct(credentials.stat().st_mode & 0o777) == "0o600"
    store = CredentialStore(credentials)
    assert store.authenticate(token) == Identity(name="alice", role=Role.CLIENT, tenant="acme")


def test_list_shows_each_token_but_no_secret_and_no_hash(credentials):
    node = create(credentials, "--name", "n0", "--role", "node", "--node-id", "node-0")
    admin = create(credentials, "--name", "ops", "--role", "admin")
    done = kvpool("list", "--credentials", str(credentials))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["id", "name", "role", "tenant", "node", "id", "created"]
    assert lines[1].split()[:4] == [node.split(".")[1], "n0", "node", "node-0"]
    assert lines[2].split()[:3] == [admin.split(".")[1], "ops", "admin"]
    for record in CredentialStore(credentials).records():
        assert record.digest not in done.stdout
    for token in (node, admin):
        assert token.split(".")[2] not in done.stdout


def test_revoke_by_name_or_id_and_the_token_stops_working(credentials):
    first = create(credentials, "--name", "alice", "--role", "client", "--tenant", "acme")
    second = create(credentials, "--name", "bob", "--role", "client", "--tenant", "acme")
    running = CredentialStore(credentials, check_interval=0)  # a master, already up
    assert running.authenticate(first) and running.authenticate(second)

    done = kvpool("revoke", "--credentials", str(credentials), "alice")
    first_id = first.split(".")[1]
    assert done.returncode == 0 and f"revoked {first_id} (alice, client of tenant acme)" in (
        done.stderr
    ), done.stderr
    done = kvpool("revoke", "--credentials", str(credentials), second.split(".")[1])
    assert done.returncode == 0, done.stderr
    assert running.authenticate(first) is None and running.authenticate(second) is None


def test_a_name_of_tokens_of_several_identities_revokes_none_unless_told(credentials):
    """A client token named like a node: revoking "node-a" must not take the node out of
    the cluster by surprise (its only replicas would go with it)."""
    node = create(credentials, "--name", "node-a", "--role", "node", "--node-id", "node-a")
    client = create(credentials, "--name", "node-a", "--role", "client", "--tenant", "acme")
    running = CredentialStore(credentials, check_interval=0)

    refused = kvpool("revoke", "--credentials", str(credentials), "node-a")
    assert refused.returncode == 2, refused.stderr
    assert "names tokens of 2 identities" in refused.stderr, refused.stderr
    assert "--every-identity" in refused.stderr and "Traceback" not in refused.stderr
    assert running.authenticate(node) and running.authenticate(client), "nothing revoked"

    by_id = kvpool("revoke", "--credentials", str(credentials), client.split(".")[1])
    assert by_id.returncode == 0, by_id.stderr
    assert running.authenticate(client) is None and running.authenticate(node)

    create(credentials, "--name", "node-a", "--role", "client", "--tenant", "acme")
    both = kvpool("revoke", "--credentials", str(credentials), "node-a", "--every-identity")
    assert both.returncode == 0 and both.stderr.count("revoked ") == 2, both.stderr
    assert "node, for node node-a" not in both.stderr and "(node-a, node for node node-a)" in (
        both.stderr
    ), both.stderr
    assert running.authenticate(node) is None


def test_the_file_defaults_to_kvpool_credentials(credentials):
    env = {"KVPOOL_CREDENTIALS": str(credentials)}
    done = kvpool("create", "--name", "ops", "--role", "admin", env=env)
    assert done.returncode == 0, done.stderr
    assert "ops" in kvpool("list", env=env).stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("list",), "give --credentials FILE or set KVPOOL_CREDENTIALS"),
        (("list", "--credentials", "{missing}"), "does not exist: create it with"),
        (("list", "--credentials", "{broken}"), "is not JSON"),
        (("revoke", "--credentials", "{empty}", "nobody"), "no token with id or name 'nobody'"),
        (("create", "--credentials", "{empty}", "--name", "x", "--role", "client"), "--tenant"),
        (
            ("create", "--credentials", "{empty}", "--name", "x", "--role", "node"),
            "give --node-id",
        ),
        (
            ("create", "--credentials", "{empty}", "--name", "bad name", "--role", "admin"),
            "not a valid identity name",
        ),
    ],
)
def test_errors_are_one_line_and_exit_2(tmp_path, args, says):
    (tmp_path / "broken.json").write_text("{")
    CredentialStore.create(tmp_path / "empty.json")
    paths = {name: str(tmp_path / f"{name}.json") for name in ("missing", "broken", "empty")}
    done = kvpool(*(arg.format(**paths) for arg in args))
    assert done.returncode == 2
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("error: ") and says in line, line


def test_a_role_that_does_not_exist_is_refused_by_the_parser(credentials):
    done = kvpool("create", "--credentials", str(credentials), "--name", "x", "--role", "root")
    assert done.returncode == 2 and "invalid choice: 'root'" in done.stderr
    assert not credentials.exists()
