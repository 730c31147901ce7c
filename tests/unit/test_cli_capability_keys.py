"""``kvpool capability-keys``: the masters' shared key file, made and rotated from the CLI."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from kvpool.cli.main import main
from kvpool.master.capability_keys import read_key_file


def test_create_makes_a_private_file_with_one_key_and_refuses_to_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "capability-keys.json"
    assert main(["capability-keys", "create", str(path)]) == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    keys = read_key_file(path)
    assert [key_id for key_id, _ in keys.keys] == [keys.current]

    assert main(["capability-keys", "create", str(path)]) == 2
    assert "rotate" in capsys.readouterr().err
    assert read_key_file(path) == keys


def test_rotate_adds_a_current_key_and_keeps_the_older_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "capability-keys.json"
    main(["capability-keys", "create", str(path)])
    first = read_key_file(path)
    assert main(["capability-keys", "rotate", str(path)]) == 0
    rotated = read_key_file(path)
    assert rotated.keys[0] == first.keys[0]
    assert rotated.current != first.current
    capsys.readouterr()
    assert main(["capability-keys", "show", str(path)]) == 0
    shown = capsys.readouterr().out
    assert f"current: {rotated.current}" in shown
    assert first.keys[0][1].hex() not in shown, "show never prints a key"


def test_a_missing_or_damaged_file_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "none.json"
    assert main(["capability-keys", "rotate", str(missing)]) == 2
    assert "capability-keys create" in capsys.readouterr().err
    damaged = tmp_path / "damaged.json"
    damaged.write_text("{")
    assert main(["capability-keys", "show", str(damaged)]) == 2
    assert capsys.readouterr().err.startswith("error: capability key file")
