"""`alma flash` end to end: the real CLI under umockdev (real libudev), a real tar.gz bundle
whose initrd-flash replays the real script's output for each outcome, real flock, real
ptys. Each outcome is asserted in the exit code and in the flash record."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from support_flash import BOOT_LOG, FLASHING_INITRD, Station, sha256

from alma.flash.records import FlashRecord, load_all, status_label

NANO = "jetson-orin-nano-devkit"
AGX = "jetson-agx-orin-devkit"


def _flash(station: Station, *args: str, device: str = "apx-7523-orin-nano-8gb", **env: str):  # type: ignore[no-untyped-def]
    return station.alma("flash", "--yes", "--console", "none", *args, device=device, **env)


def logs_of(rec: dict[str, object]) -> dict[str, str]:
    return rec["logs"]  # type: ignore[return-value]


def _only_record(station: Station) -> dict[str, object]:
    recs = station.records_list()
    assert len(recs) == 1, recs
    return recs[0]


def _ready(station: Station, **kw: object) -> Path:
    b = station.bundle(**kw)
    station.manifest(b, str(kw.get("machine", NANO)))
    return b


def test_success_is_exit_0_and_a_flashed_record(station: Station) -> None:
    b = _ready(station)
    r = _flash(station)
    assert r.returncode == 0, r.stderr
    rec = _only_record(station)
    assert rec["result"] == "SUCCESS" and rec["final_status"] == "SUCCESS" and rec["exit_code"] == 0
    assert rec["bundle_sha256"] == sha256(b)
    assert rec["machine"] == NANO
    assert rec["board"]["usb_instance"] == "1-3" and rec["board"]["product"] == "7523"  # type: ignore[index]
    assert [p["name"] for p in rec["phases"]] == [  # type: ignore[union-attr]
        "prepare",
        "wait-board",
        "sign",
        "rcm-boot",
        "flashpkg",
        "send-commands",
        "storage",
        "flash",
        "final-status",
    ]
    assert all(p["result"] == "ok" for p in rec["phases"])  # type: ignore[union-attr,index]
    assert (station.records / logs_of(rec)["transcript"]).is_file()  # kept for success too
    logs = rec["logs"]
    host_log = station.records / logs["host_log"]  # type: ignore[index,operator]
    assert host_log.name.startswith("log.initrd-flash.") and "Final status: SUCCESS" in host_log.read_text()
    assert any("device-logs-" in p for p in logs["device_logs"])  # type: ignore[index,union-attr]
    assert "== Step 4: Writing partitions on internal storage device at" in r.stderr
    # the evidence moves the label: Prototype -> Flashed (no console, so not Booted)
    assert status_label(sha256(b), load_all(station.records)) == "Flashed"
    assert station.leftovers() == []


def test_final_status_failed_with_exit_0_is_a_failure(station: Station) -> None:
    b = _ready(station, outcomes={"*": "final-failed"})
    r = _flash(station)
    assert r.returncode == 3
    rec = _only_record(station)
    assert rec["result"] == "FAILED"
    assert rec["exit_code"] == 0  # initrd-flash said 0...
    assert rec["final_status"] == "FAILED"  # ...but the device said FAILED
    assert "Final status: FAILED" in str(rec["reason"]) and "exited 0" in str(rec["reason"])
    assert status_label(sha256(b), load_all(station.records)) == "Prototype"


def test_hang_waiting_for_storage_times_out_and_kills_the_script(station: Station, tmp_path: Path) -> None:
    _ready(station, outcomes={"*": "hang-storage"})
    pidfile = tmp_path / "sim.pid"
    t0 = time.monotonic()
    r = _flash(station, "--phase-timeout", "storage=1.5", SIM_PIDFILE=str(pidfile))
    took = time.monotonic() - t0
    assert r.returncode == 4, r.stderr
    rec = _only_record(station)
    assert rec["result"] == "TIMEOUT"
    assert "mmcblk0 never appeared" in str(rec["reason"]) and "storage phase's limit (2 s)" in str(rec["reason"])
    assert "--erase-nvme" in str(rec["reason"]) and "vanished" not in str(rec["reason"])
    assert rec["phases"][-1] == {**rec["phases"][-1], "name": "storage", "result": "timeout"}  # type: ignore[index]
    assert took < 120  # the 1.5 s limit, not the storage phase's 180 s default (load allowed)
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the script's whole process group was stopped


def test_usb_write_timeout_is_named(station: Station) -> None:
    """rcm-boot.sh always exits 0: a USB timeout in RCM boot is only an endless wait for
    flashpkg; its own short phase limit names it (from the host log), not the 300 s one."""
    _ready(station, outcomes={"*": "usb-write-timeout"})
    t0 = time.monotonic()
    r = _flash(station, "--phase-timeout", "flashpkg=1.5")
    # the record names the short limit; the time only catches a hang far past it (flashpkg's
    # own default is 120 s, so the CLI's start-up under load gets the rest)
    assert time.monotonic() - t0 < 100
    assert r.returncode == 4, r.stderr
    rec = _only_record(station)
    assert rec["result"] == "TIMEOUT" and rec["final_status"] is None
    reason = str(rec["reason"])
    assert "might be timeout in USB write" in reason and "flashpkg" in reason and "no hub" in reason
    assert "send-commands" not in reason
    assert rec["phases"][-1]["name"] == "flashpkg" and rec["phases"][-1]["result"] == "timeout"  # type: ignore[index]


def test_board_vanishing_mid_flash(station: Station) -> None:
    _ready(station, outcomes={"*": "vanish"})
    r = _flash(station)
    assert r.returncode == 3
    rec = _only_record(station)
    assert rec["result"] == "FAILED"
    assert "vanished from USB mid-flash" in str(rec["reason"]) and "/dev/sdb1" in str(rec["reason"])
    assert rec["phases"][-1]["name"] == "flash"  # type: ignore[index]


def test_unexpected_gadget(station: Station) -> None:
    _ready(station, outcomes={"*": "unexpected-gadget"})
    r = _flash(station)
    assert r.returncode == 3
    rec = _only_record(station)
    # the real script exits 1 here (early_final_status is set in a subshell), with no device logs
    assert rec["exit_code"] == 1 and rec["final_status"] is None
    assert "exported flashpkg when mmcblk0 was expected" in str(rec["reason"])
    assert "see the device logs" not in str(rec["reason"]) and logs_of(rec)["device_logs"] == []


# -- refusals: exit 2, a REFUSED record, the bundle untouched, nothing unpacked left ------


def _refused(station: Station, bundle: Path, r, says: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert says in r.stderr
    assert "try:" in r.stderr and "Traceback" not in r.stderr
    rec = _only_record(station)
    assert rec["result"] == "REFUSED" and says in str(rec["reason"])
    assert station.leftovers() == []
    return rec


def test_agx_bundle_on_orin_nano_is_refused_naming_both(station: Station) -> None:
    b = _ready(station, machine=AGX)
    digest = sha256(b)
    r = _flash(station, "--machine", AGX)
    rec = _refused(station, b, r, "does not fit USB 1-3")
    assert AGX in r.stderr and "Jetson AGX Orin" in r.stderr and "Jetson Orin Nano" in r.stderr
    assert rec["phases"] == []  # refused from the manifest, before unpacking anything
    assert sha256(b) == digest


def test_wrong_machine_caught_from_the_bundle_itself(station: Station) -> None:
    """The manifest has no env_machine: the bundle's own .env.initrd-flash decides."""
    b = station.bundle(machine=AGX)
    mpath = station.manifest(b, AGX)
    data = json.loads(mpath.read_text())
    del data["facts"]["env_machine"]
    mpath.write_text(json.dumps(data))
    r = _flash(station, "--machine", AGX)
    rec = _refused(station, b, r, "does not fit USB 1-3")
    assert [p["name"] for p in rec["phases"]] == ["prepare"]  # type: ignore[union-attr,index]
    assert rec["bundle_sha256"] == sha256(b)


def test_hash_mismatch_is_refused(station: Station) -> None:
    b = station.bundle()
    station.manifest(b, sha="ab" * 32)
    digest = sha256(b)
    r = _flash(station)
    rec = _refused(station, b, r, "sha256 mismatch")
    assert rec["bundle_sha256"] == digest  # the record names what was really on disk
    assert sha256(b) == digest


def test_size_differs_from_manifest_is_refused_before_reading(station: Station) -> None:
    b = _ready(station)
    with open(b, "ab") as fh:
        fh.write(b"\0" * 10)
    r = _flash(station)
    _refused(station, b, r, "not the verified bundle")


def test_path_traversal_bundle_is_refused(station: Station) -> None:
    import io
    import tarfile

    b = station.base / "evil.tegraflash.tar.gz"
    with tarfile.open(b, "w:gz") as tar:
        for name, data in ((".env.initrd-flash", b'MACHINE="jetson-orin-nano-devkit"\n'), ("../../pwned", b"x")):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    digest = sha256(b)
    r = _flash(station, str(b), "--sha256", digest)
    _refused(station, b, r, "climbs out with '..'")
    assert not (station.base.parent / "pwned").exists()
    assert sha256(b) == digest


@pytest.mark.parametrize(
    ("kind", "says"),
    [("symlink", "points outside the bundle"), ("device", "is a device or fifo")],
)
def test_symlink_escape_and_device_file_bundles_are_refused(station: Station, kind: str, says: str) -> None:
    import io
    import tarfile

    b = station.base / f"{kind}.tegraflash.tar.gz"
    with tarfile.open(b, "w:gz") as tar:
        env = b'MACHINE="jetson-orin-nano-devkit"\nCHIPID="0x23"\n'
        ti = tarfile.TarInfo("./.env.initrd-flash")
        ti.size = len(env)
        tar.addfile(ti, io.BytesIO(env))
        bad = tarfile.TarInfo("./initrd-flash")
        if kind == "symlink":
            bad.type, bad.linkname = tarfile.SYMTYPE, "../../../../usr/bin/true"
        else:
            bad.type, bad.devmajor, bad.devminor = tarfile.BLKTYPE, 259, 0
        tar.addfile(bad)
    digest = sha256(b)
    r = _flash(station, str(b), "--sha256", digest)
    _refused(station, b, r, says)
    assert sha256(b) == digest


def test_truncated_bundle_is_refused(station: Station) -> None:
    b = station.bundle()
    data = b.read_bytes()
    b.write_bytes(data[: len(data) * 2 // 3])
    digest = sha256(b)
    r = _flash(station, str(b), "--sha256", digest)
    _refused(station, b, r, "truncated or corrupt")
    assert sha256(b) == digest


def test_locked_board_is_refused(station: Station) -> None:
    """Another flasher holds the board's own USB device node (inside the same umockdev
    testbed, so both see one node); the lock dir setting plays no part any more."""
    import subprocess
    import sys

    from support import require_tool
    from support_flash import DEVICES

    b = _ready(station)
    holder = (
        "import fcntl, os, subprocess, sys; fd = os.open('/dev/bus/usb/001/007', os.O_RDONLY); "
        "fcntl.flock(fd, fcntl.LOCK_EX); "
        "r = subprocess.run([sys.executable, '-m', 'alma', 'flash', '--yes', '--console', 'none'], "
        "capture_output=True, text=True); sys.stderr.write(r.stderr); sys.exit(r.returncode)"
    )
    cmd = [require_tool("umockdev-run"), "--device", str(DEVICES / "apx-7523-orin-nano-8gb.umockdev"), "--"]
    r = subprocess.run(
        [*cmd, sys.executable, "-c", holder],
        env=station.env(ALMA_LOCK_DIR=str(station.base / "elsewhere")),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    _refused(station, b, r, "already being flashed")
    assert "/dev/bus/usb/001/007" in r.stderr


def test_no_board_is_refused_with_what_to_do(station: Station) -> None:
    b = _ready(station)
    r = _flash(station, device="no-nvidia")
    _refused(station, b, r, "no Jetson in recovery mode")
    assert "alma boards --wait" in r.stderr


def test_no_manifest_and_no_hash_is_refused(station: Station) -> None:
    b = station.bundle()
    r = _flash(station, str(b))
    _refused(station, b, r, "sha256 cannot be checked")


def test_refuses_without_yes_when_not_a_terminal(station: Station) -> None:
    _ready(station)
    r = station.alma("flash", "--console", "none", device="apx-7523-orin-nano-8gb")
    assert r.returncode == 2 and "--yes" in r.stderr
    assert station.records_list() == []  # nothing was attempted


# -- several boards at once ------------------------------------------------------------


def test_all_flashes_concurrently_one_failure_does_not_stop_the_others(station: Station) -> None:
    """three-boards: 1-3 AGX (refused: Nano bundle), 1-4 Nano (fails), 1-8.4 Nano behind a hub (ok)."""
    b = _ready(station, outcomes={"1-4": "final-failed", "*": "success"})
    r = _flash(station, "--all", "--json", device="three-boards", SIM_DELAY="0.3")
    assert r.returncode == 3, r.stderr  # a failure outranks a refusal in the exit code
    out = json.loads(r.stdout)
    assert out["exit_code"] == 3
    by_board = {rec["board"]["usb_instance"]: rec for rec in out["records"]}
    assert by_board["1-3"]["result"] == "REFUSED" and "does not fit" in by_board["1-3"]["reason"]
    assert by_board["1-4"]["result"] == "FAILED" and by_board["1-4"]["final_status"] == "FAILED"
    assert by_board["1-8.4"]["result"] == "SUCCESS"
    assert len(station.records_list()) == 3
    # one extraction for all boards
    assert r.stderr.count("bundle verified: sha256") == 1
    assert r.stderr.count("verifying + unpacking bundle: 100%") == 1
    # each board ran in its own directory: separate host logs
    logs = {k: v["logs"]["host_log"] for k, v in by_board.items() if v["result"] != "REFUSED"}
    assert len(set(logs.values())) == 2
    # concurrently: the two flashes overlapped in time
    p4, p8 = by_board["1-4"]["phases"], by_board["1-8.4"]["phases"]
    assert p4[1]["started"] <= p8[-1]["finished"] and p8[1]["started"] <= p4[-1]["finished"]
    assert status_label(sha256(b), [FlashRecord.from_dict(x) for x in station.records_list()]) == "Flashed"


def test_several_boards_without_all_or_board_is_refused(station: Station) -> None:
    _ready(station)
    r = _flash(station, device="three-boards")
    assert r.returncode == 2 and "--board USB_INSTANCE, or --all" in r.stderr


def test_board_option_picks_one(station: Station) -> None:
    _ready(station)
    r = _flash(station, "--board", "1-8.4", device="three-boards")
    assert r.returncode == 0, r.stderr
    assert _only_record(station)["board"]["usb_instance"] == "1-8.4"  # type: ignore[index]


# -- boot confirmation on the console ----------------------------------------------------


def _fake_board_console(signal: Path, boot_log: bytes | None) -> tuple[str, threading.Thread, list[int]]:
    master, slave = os.openpty()
    port = os.ttyname(slave)
    fds = [master, slave]

    def run() -> None:
        os.write(master, FLASHING_INITRD)  # during the flash: the initrd's kernel
        for _ in range(600):  # wait (bounded) for the flash to end: the simulator signals it
            if signal.exists():
                break
            time.sleep(0.05)
        if boot_log is not None:
            time.sleep(0.2)
            os.write(master, BOOT_LOG if boot_log == b"default" else boot_log)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return port, t, fds


@pytest.mark.parametrize("log", [b"default", None], ids=["boots", "silent"])
def test_console_confirms_the_boot(station: Station, tmp_path: Path, log: bytes | None) -> None:
    b = _ready(station)
    signal = tmp_path / "rebooting"
    port, t, fds = _fake_board_console(signal, log)
    try:
        r = station.alma(
            "flash",
            "--yes",
            "--console",
            port,
            "--boot-timeout",
            "3" if log else "1",
            device="apx-7523-orin-nano-8gb",
            SIM_BOOT_SIGNAL=str(signal),
        )
    finally:
        t.join(timeout=5)
        for fd in fds:
            os.close(fd)
    rec = _only_record(station)
    boot = rec["boot"]
    assert boot["console"] == port  # type: ignore[index]
    if log:
        assert r.returncode == 0, r.stderr
        assert boot["seen"] is True and boot["login_prompt"] == "alma-orin login:"  # type: ignore[index]
        assert "(aarch64-oe-linux-gcc" in boot["kernel_banner"]  # type: ignore[index] # the new kernel, not the initrd's
        assert rec["phases"][-1]["name"] == "boot" and rec["phases"][-1]["result"] == "ok"  # type: ignore[index]
        assert status_label(sha256(b), load_all(station.records)) == "Booted"
    else:
        assert r.returncode == 5
        assert boot["seen"] is False and "silence" in boot["reason"]  # type: ignore[index]
        assert status_label(sha256(b), load_all(station.records)) == "Flashed"


def test_help_documents_the_exit_codes(station: Station) -> None:
    r = station.alma("flash", "--help", device=None)
    for code in ("0 every board flashed", "2 refused", "3 a flash failed", "4 a phase timed out", "5 flashed but"):
        assert code in " ".join(r.stdout.split())


def test_ctrl_c_during_all_stops_every_flash_and_records_it(station: Station, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    from support import require_tool
    from support_flash import DEVICES

    _ready(station, outcomes={"*": "hang-storage"})
    pidfile = tmp_path / "sims.pid"
    waiting = tmp_path / "sims.waiting"
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
    # a new session stands in for the terminal: Ctrl-C signals the whole foreground group
    proc = subprocess.Popen(
        cmd,
        env=station.env(SIM_PIDFILE=str(pidfile), SIM_WAITING=str(waiting), PYTHONFAULTHANDLER="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    err_lines: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: err_lines.extend(iter(proc.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        # both Orin Nanos are in the endless storage wait and alma has shown step 4 for both
        # (alma prints each banner as it reads it; generous: CI machines are loaded)
        for _ in range(1200):
            shown = "".join(err_lines)
            in_wait = waiting.exists() and len(waiting.read_text().splitlines()) == 2
            if in_wait and "[1-4] == Step 4:" in shown and "[1-8.4] == Step 4:" in shown:
                break
            time.sleep(0.05)
        else:
            kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            if kids:  # stacks of every alma thread, to see where it stands
                os.kill(int(kids[0]), signal.SIGABRT)
                time.sleep(1)
            pytest.fail(
                f"the simulated flashes never reached the storage wait (umockdev-run children {kids}; "
                f"waiting: {waiting.read_text() if waiting.exists() else None!r}):\n" + "".join(err_lines)
            )
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            # a hang is a bug: make alma dump every thread's stack (PYTHONFAULTHANDLER) and show it
            alma = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
            os.kill(alma, signal.SIGABRT)
            proc.wait(timeout=30)
            reader.join(timeout=5)
            pytest.fail("alma flash did not stop after Ctrl-C:\n" + "".join(err_lines))
        reader.join(timeout=10)
        err = "".join(err_lines)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    recs = station.records_list()
    results = sorted((r["board"]["usb_instance"], r["result"]) for r in recs)  # type: ignore[index]
    assert results == [("1-3", "REFUSED"), ("1-4", "INTERRUPTED"), ("1-8.4", "INTERRUPTED")]
    for rec in recs:
        if rec["result"] != "INTERRUPTED":
            continue
        # the phases it reached, the last one marked interrupted, and the evidence kept
        names = [p["name"] for p in rec["phases"]]  # type: ignore[union-attr,index]
        assert names[:2] == ["prepare", "wait-board"] and names[-1] == "storage", names
        assert rec["phases"][-1]["result"] == "interrupted"  # type: ignore[index]
        host_log = station.records / logs_of(rec)["host_log"]
        assert "== Step 3: Sending flash sequence commands" in host_log.read_text()  # the script's own log, kept
        assert (station.records / logs_of(rec)["transcript"]).is_file()
    for pid in map(int, pidfile.read_text().split()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert station.leftovers() == []
