"""almaboard.files.read_json reads state files other processes wrote: hostile until checked."""

from __future__ import annotations

from pathlib import Path

from almaboard.files import read_json, write_json


def test_deeply_nested_json_is_invalid_not_a_crash(tmp_path: Path) -> None:
    f = tmp_path / "state.json"
    f.write_text("[" * 200_000 + "]" * 200_000)
    assert read_json(f) is None


def test_oversized_file_is_not_read(tmp_path: Path) -> None:
    f = tmp_path / "state.json"
    f.write_text('{"pad": "' + "x" * (2 << 20) + '"}')
    assert read_json(f) is None
    assert read_json(f, limit=4 << 20) == {"pad": "x" * (2 << 20)}


def test_round_trip_and_absent(tmp_path: Path) -> None:
    f = tmp_path / "state.json"
    assert read_json(f) is None
    write_json(f, {"a": [1, 2]})
    assert read_json(f) == {"a": [1, 2]}
    assert f.stat().st_mode & 0o777 == 0o644
