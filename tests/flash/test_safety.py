"""`alma flash` end to end against the issue's defects: hostile bundles and bombs refused
before any board is touched (exit 2, no traceback, the simulator never ran), records dir
probed first, signals (two SIGINTs, SIGTERM) always exit 130 with complete records, the
initrd-flash options passed through and recorded, disk full while copying for a board."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flash.test_unpack import Arc, _bomb, cve_2025_4517
from support import require_tool
from support_flash import DEVICES, Station, sha256

from alma.errors import UserError
from alma.flash import bundle as bundles

NANO = "jetson-orin-nano-devkit"


def _flash(station: Station, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return station.alma("flash", "--yes", "--console", "none", *args, device="apx-7523-orin-nano-8gb", **env)


def test_cve_2025_4517_bundle_is_refused_before_the_board_and_writes_nothing_outside(
    station: Station, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "flag").write_text("original")
    arc = Arc()
    arc.add("initrd-flash", content="#!/bin/sh\ntouch ran\n", mode=0o755)
    # the real chain (it overwrote outside/flag through the old tarfile-filter unpack, then
    # reported "sha256 mismatch"); aimed from where alma unpacks: work/run-*/.extract-*
    cve_2025_4517(arc, station.work / "run-xxxxxxxx" / ".extract-xxxxxxxx", outside)
    b = arc.write(tmp_path / "evil.tegraflash.tar.gz")
    pidfile = tmp_path / "sim.pid"
    for sha in (sha256(b), "ab" * 32):  # whatever the hash
        r = _flash(station, str(b), "--sha256", sha, SIM_PIDFILE=str(pidfile))
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and "refused" in r.stderr
        assert (outside / "flag").read_text() == "original"
        assert not pidfile.exists()  # the board was never touched
        assert station.leftovers() == []
    recs = station.records_list()
    assert [r["result"] for r in recs] == ["REFUSED", "REFUSED"]


def test_a_bomb_is_refused_in_seconds_with_the_numbers(station: Station, tmp_path: Path) -> None:

    b = _bomb(tmp_path / "bomb.tegraflash.tar.gz", 20 << 30)
    t0 = time.monotonic()
    r = _flash(station, str(b), "--sha256", sha256(b), "--unpack-cap", "5")
    assert time.monotonic() - t0 < 120  # refused up front: unpacking 20 GB takes far longer (load allowed)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "needs 21.5 GB, more than the unpack cap of 5.0 GB" in r.stderr
    assert station.leftovers() == []


def test_unwritable_records_dir_is_refused_before_flashing(station: Station, tmp_path: Path) -> None:
    b = station.bundle()
    station.manifest(b)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    pidfile = tmp_path / "sim.pid"
    r = _flash(station, "--records-dir", str(blocker / "records"), SIM_PIDFILE=str(pidfile))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "cannot write flash records" in r.stderr and "nothing was flashed" in r.stderr
    assert not pidfile.exists()


def test_missing_signing_key_is_refused(station: Station, tmp_path: Path) -> None:
    b = station.bundle()
    station.manifest(b)
    r = _flash(station, "--pkc-key", str(tmp_path / "nope.pem"))
    assert r.returncode == 2 and "signing key -u" in r.stderr


def test_options_are_passed_through_recorded_and_the_presigned_warning_surfaced(
    station: Station, tmp_path: Path
) -> None:
    key = tmp_path / "rsa_priv.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\nSECRET-KEY-MATERIAL\n-----END PRIVATE KEY-----\n")
    tree_extra = station.base / "tree-b"
    b = station.bundle()
    # a pre-signed bundle carries .presigning-vars: rebuild it with one
    (tree_extra / ".presigning-vars").write_text("BR_CID=0x80012344705DE803\n")
    from support_flash import tar_gz

    b.unlink()
    tar_gz(tree_extra, b)
    station.manifest(b)
    argv = tmp_path / "argv"
    r = _flash(station, "--erase-nvme", "--skip-bootloader", "--pkc-key", str(key), SIM_ARGV=str(argv))
    assert r.returncode == 0, r.stderr
    assert argv.read_text().split() == ["--usb-instance", "1-3", "--erase-nvme", "--skip-bootloader", "-u", str(key)]
    (rec,) = station.records_list()
    assert rec["options"] == {"erase_nvme": True, "skip_bootloader": True, "pkc_key": str(key), "sbk_key": None}
    assert rec["warnings"] == ["WARN: binaries already signed; ignoring signing options"]
    assert "binaries already signed" in r.stderr
    everything = r.stdout + r.stderr + "".join(p.read_text() for p in station.records.rglob("*") if p.is_file())
    assert "SECRET-KEY-MATERIAL" not in everything  # a key path is recorded, never its contents


def _start_all(station: Station, pidfile: Path) -> subprocess.Popen[str]:
    b = station.bundle(outcomes={"*": "hang-storage"})
    station.manifest(b)
    cmd = [
        require_tool("umockdev-run"),
        "--device",
        str(DEVICES / "three-boards.umockdev"),
        "--",
        sys.executable,
        "-m",
        "alma",
        "flash",
        "--yes",
        "--all",
        "--console",
        "none",
        "--machine",
        NANO,
    ]
    proc = subprocess.Popen(
        cmd,
        env=station.env(SIM_PIDFILE=str(pidfile), SIM_WAITING=str(pidfile) + ".waiting"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    waiting = Path(str(pidfile) + ".waiting")
    for _ in range(1200):
        if waiting.exists() and len(waiting.read_text().splitlines()) == 2:
            return proc
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail("the simulated flashes never reached the storage wait")


@pytest.mark.parametrize(
    ("signals", "gap"),
    [((signal.SIGINT, signal.SIGINT), 0.005), ((signal.SIGTERM,), 0.0), ((signal.SIGINT,) * 20, 0.0)],
    ids=["two-sigints", "sigterm", "burst-of-20"],
)
def test_signals_always_exit_130_with_complete_records(
    station: Station, tmp_path: Path, signals: tuple[int, ...], gap: float
) -> None:
    pidfile = tmp_path / "sims.pid"
    proc = _start_all(station, pidfile)
    try:
        time.sleep(0.5)
        # signal alma itself (umockdev-run, standing in for the terminal's session, dies of
        # a second SIGINT on its own): its pid is umockdev-run's child
        alma = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
        for s in signals:
            os.kill(alma, s)
            if gap:
                time.sleep(gap)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    recs = station.records_list()  # every record complete JSON (a torn one would not load)
    assert sorted(r["result"] for r in recs) == ["INTERRUPTED", "INTERRUPTED", "REFUSED"]
    for pid in map(int, pidfile.read_text().split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert station.leftovers() == []


def test_disk_full_copying_for_a_board_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from support_flash import make_bundle_tree, tar_gz

    b = tar_gz(make_bundle_tree(tmp_path / "tree"), tmp_path / "b.tar.gz")
    prepared = bundles.prepare(b, tmp_path / "work", None)

    def full(*a: object, **k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(bundles, "sparse_copy", full)
    monkeypatch.setattr(bundles, "_reflink", lambda s, d: False)
    with pytest.raises(UserError) as ei:
        bundles.clone_for_board(prepared, tmp_path / "work" / "boards" / "1-3")
    assert "no space left copying the bundle for board 1-3" in ei.value.message
    assert not (tmp_path / "work" / "boards" / "1-3").exists()


def test_space_for_the_per_board_copies_is_checked_first(tmp_path: Path) -> None:
    from support_flash import make_bundle_tree, tar_gz

    from alma.tegraflash.unpack import Budget

    b = tar_gz(make_bundle_tree(tmp_path / "tree"), tmp_path / "b.tar.gz")
    prepared = bundles.prepare(b, tmp_path / "work", None)
    need = bundles.copy_bytes_needed(prepared)
    assert need > 0
    with pytest.raises(UserError, match=r"copying the bundle for 4 board\(s\) needs"):
        bundles.check_copy_space(prepared, 4, Budget(margin=0, free=lambda p: need * 3), tmp_path)
    bundles.check_copy_space(prepared, 3, Budget(margin=0, free=lambda p: need * 3), tmp_path)


def test_the_signal_flag_can_be_set_while_its_lock_is_held() -> None:
    """The state a second signal finds when it lands inside the first handler's set():
    threading.Event.set would wait for its own lock forever (the old Ctrl-C hang)."""
    from alma.flash.interrupt import Interruption, SignalFlag

    flag = SignalFlag()
    with flag._cond:  # type: ignore[attr-defined]
        flag.set()
    assert flag.is_set() and flag.wait(0)
    stop = Interruption()
    with stop.cancel._cond, stop.urgent._cond:  # type: ignore[attr-defined]
        stop._handler(signal.SIGINT, None)
        stop._handler(signal.SIGINT, None)
    assert stop.interrupted and stop.urgent.is_set()


def test_a_record_that_cannot_be_written_is_a_clear_error_and_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills between the records-dir probe and the end of the flash."""
    import json as _json

    from alma.flash import records
    from alma.flash.records import FlashRecord
    from alma.flash.session import BoardRun, FlashOptions, FlashSession

    events: list[tuple[str, dict[str, object]]] = []
    session = FlashSession(
        FlashOptions(root=tmp_path, records_dir=tmp_path / "records"), on_event=lambda k, d: events.append((k, d))
    )

    def full(*a: object, **k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(records, "write_atomic", full)
    rec = FlashRecord({"usb_instance": "1-3"}, "ab" * 32, "b", NANO, "2026-12-01T00:00:00Z", "x", "SUCCESS")
    run = session._save(BoardRun(None, rec))
    assert run.path is None and session.record_errors
    assert "cannot write the flash record" in session.record_errors[0].message
    (lost,) = [d for k, d in events if k == "record-lost"]
    assert _json.loads(str(lost["json"]))["result"] == "SUCCESS"  # the evidence, on stderr


def test_ctrl_c_at_the_confirmation_prompt_aborts_with_130_and_touches_nothing(
    station: Station, tmp_path: Path
) -> None:
    b = station.bundle()
    station.manifest(b)
    pidfile = tmp_path / "sim.pid"
    master, slave = os.openpty()
    cmd = [require_tool("umockdev-run"), "--device", str(DEVICES / "apx-7523-orin-nano-8gb.umockdev"), "--"]
    proc = subprocess.Popen(
        [*cmd, sys.executable, "-m", "alma", "flash", "--console", "none"],
        env=station.env(SIM_PIDFILE=str(pidfile)),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    try:
        seen = b""
        deadline = time.monotonic() + 60
        while b"Erase and flash" not in seen and time.monotonic() < deadline:
            seen += os.read(master, 4096)
        assert b"Erase and flash" in seen, seen
        alma = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
        # CPython cannot interrupt a read() that a signal beat by a hair (the handler then runs
        # only when the read returns): like a technician, press Ctrl-C again if need be
        for _ in range(60):
            try:
                os.kill(alma, signal.SIGINT)
            except ProcessLookupError:
                break  # alma has exited; umockdev-run is still reaping it
            try:
                proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                continue
        assert proc.wait(timeout=5) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        os.close(master)
    assert not pidfile.exists() and station.records_list() == []
