"""Flash records: round trip, atomic write, malformed input, status labels from evidence."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from alma import ground
from alma.errors import ConfigError
from alma.flash import records


def _rec(
    sha: str, result: str = "SUCCESS", final: str | None = "SUCCESS", boot: bool | None = None
) -> records.FlashRecord:
    return records.FlashRecord(
        board={"usb_instance": "1-8.4", "product": "7523"},
        bundle_sha256=sha,
        bundle_path="/deploy/alma-image-jetson-orin-nano-devkit.rootfs.tegraflash.tar.gz",
        machine="jetson-orin-nano-devkit",
        started="2026-11-30T10:00:00Z",
        finished="2026-11-30T10:09:00Z",
        result=result,
        final_status=final,
        exit_code=0,
        phases=[records.Phase("flash", "2026-11-30T10:01:00Z", "2026-11-30T10:08:00Z", "ok")],
        boot=None if boot is None else records.Boot(seen=boot, console="/dev/ttyACM0"),
    )


def test_round_trip(tmp_path: Path) -> None:
    r = _rec("a" * 64, boot=True)
    path = records.save(r, tmp_path)
    assert path.name.endswith("-jetson-orin-nano-devkit-1-8.4.json")
    [back] = records.load_all(tmp_path)
    assert back == r and back.booted


def test_labels_follow_evidence() -> None:
    sha = "b" * 64
    assert records.status_label(sha, []) == "Prototype"
    # initrd-flash exits 0 with "Final status: FAILED": not flashed
    assert records.status_label(sha, [_rec(sha, result="FAILED", final="FAILED")]) == "Prototype"
    assert records.status_label(sha, [_rec(sha)]) == "Flashed"
    assert records.status_label(sha, [_rec(sha, boot=False)]) == "Flashed"
    assert records.status_label(sha, [_rec(sha, boot=True)]) == "Booted"
    # a record for another bundle proves nothing about this one
    assert records.status_label(sha, [_rec("c" * 64, boot=True)]) == "Prototype"


def test_malformed_record_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text(json.dumps({"schema": "alma.flash-record/1", "board": {}}))
    with pytest.raises(ConfigError) as ei:
        records.load_all(tmp_path)
    assert "x.json" in ei.value.message and ei.value.hint


def test_atomic_write_leaves_old_file_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "f.json"
    target.write_text("old")

    def boom(*a: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)  # the board library does the rename
    with pytest.raises(OSError):
        ground.write_atomic(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


@pytest.mark.parametrize(
    "content",
    [
        b"[1, 2]",
        json.dumps({"schema": "alma.flash-record/1", "phases": [{"bogus": 1}]}).encode(),
        json.dumps({"schema": "alma.flash-record/1", "phases": [1]}).encode(),
        b"\xff\xfe not utf-8",
    ],
)
def test_any_bad_record_is_a_config_error_not_a_traceback(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "bad.json").write_bytes(content)
    with pytest.raises(ConfigError) as ei:
        records.load_all(tmp_path)
    assert "bad.json" in ei.value.message


def test_atomic_write_gives_readable_files_and_keeps_an_existing_mode(tmp_path: Path) -> None:
    new = tmp_path / "new.json"
    ground.write_atomic(new, "{}")
    assert new.stat().st_mode & 0o044 == 0o044  # group/others can read a committed manifest
    kept = tmp_path / "kept.json"
    kept.write_text("old")
    kept.chmod(0o640)
    ground.write_atomic(kept, "new")
    assert kept.stat().st_mode & 0o777 == 0o640 and kept.read_text() == "new"
