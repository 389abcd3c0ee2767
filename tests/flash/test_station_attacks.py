"""Attacks on `alma flash` that are not about tar headers or other users: bundle
text choosing a path, device/script text as rich markup or raw control sequences, a forged
console identity, a scope-id address, a records disk that fills mid-flash, dense per-board
copies of sparse images, leftovers of a killed run, FIFOs and devices as bundles, Ctrl-C
in the boot watch, a script that outlives SIGTERM."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support import require_tool
from support_flash import DEVICES, IMAGE, Station, make_bundle_tree, sha256, tar_gz

from alma.errors import UserError
from alma.flash import bundle as bundles
from alma.flash import identity, records
from alma.flash.records import Boot, FlashRecord

NANO = "jetson-orin-nano-devkit"
KEY = "SHA256:" + "A" * 43
KEY2 = "SHA256:" + "B" * 43


def _flash(station: Station, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return station.alma("flash", "--yes", "--console", "none", *args, **env)


# --- 2. bundle text never chooses a path --------------------------------------------


def test_machine_from_the_bundle_never_becomes_a_path(station: Station, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    evil = f"x/../../../../../../../../..{outside}/PWNREC"
    tree = make_bundle_tree(tmp_path / "tree")
    env = (tree / ".env.initrd-flash").read_text().replace(f'MACHINE="{NANO}"', f'MACHINE="{evil}"')
    (tree / ".env.initrd-flash").write_text(env)
    b = tar_gz(tree, tmp_path / f"{IMAGE}-x.rootfs-20261130120000.tegraflash.tar.gz")
    r = _flash(station, str(b), "--sha256", sha256(b))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "is not a meta-tegra machine name" in r.stderr
    assert list(outside.iterdir()) == []
    assert [p for p in station.records.iterdir() if p.is_dir()] == []  # no stray records subdir
    (rec,) = station.records_list()
    assert rec["result"] == "REFUSED" and "PWNREC" in str(rec["reason"])
    assert station.leftovers() == []


def test_record_names_take_only_grammatical_parts(tmp_path: Path) -> None:
    for machine, usb in (("../../x", "1-3"), (NANO, "../../../etc/x"), ("a\x1b]0;t\x07", "1-3\n")):
        rec = FlashRecord({"usb_instance": usb}, "ab" * 32, "b", machine, "2026-12-01T00:00:00Z", "x", "REFUSED")
        path = records.save(rec, tmp_path)
        assert path.parent == tmp_path and "/" not in path.name and "\x1b" not in path.name
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "20261201T000000Z-invalid-machine-1-3.json",
        "20261201T000000Z-invalid-machine-invalid-usb.json",
        "20261201T000000Z-jetson-orin-nano-devkit-invalid-usb.json",
    ]


def test_a_board_option_that_is_not_a_usb_instance_is_refused(station: Station) -> None:
    b = station.bundle()
    station.manifest(b)
    r = _flash(station, "--board", "../../x")
    assert r.returncode == 2 and "is not a USB instance" in r.stderr and "Traceback" not in r.stderr


# --- 4. one terminal path for untrusted text --------------------------------------------


def test_device_text_is_never_rich_markup(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real initrd-flash prints `...[/dev/sda]` (MarkupError froze the progress) and a
    device final status `[/x]` turned exit 3 into 70 in the summary."""
    from rich.console import Console

    from alma.cli import flash as cli
    from alma.flash.flasher import FlashEvent
    from alma.flash.session import BoardRun

    out = io.StringIO()
    fake = Console(file=out, force_terminal=True, width=200)
    monkeypatch.setattr(cli, "console", lambda stderr=False: fake)
    monkeypatch.setattr(cli, "is_tty", lambda: True)
    d = cli._Display(json_mode=False)
    d.rows["1-3"] = {"phase": "flashpkg", "line": "", "t0": time.monotonic()}
    d.event(
        "line", {"event": FlashEvent("1-3", "flashpkg", "Waiting for USB storage device flashpkg from S...[/dev/sda]")}
    )
    fake.print(d._render())
    rec = FlashRecord(
        {"usb_instance": "1-3"}, "ab" * 32, "b", NANO, "t", "t", "FAILED", reason="final status [/x] [bold]"
    )
    cli._summary([BoardRun(None, rec)])
    text = out.getvalue()
    assert "[/dev/sda]" in text and "[/x] [bold]" in text


def test_control_sequences_are_made_visible_in_lines_and_records(tmp_path: Path) -> None:
    from alma.flash.flasher import InitrdFlasher

    board = tmp_path / "board"
    board.mkdir()
    script = board / "initrd-flash"
    script.write_text(
        "#!/bin/sh\n"
        "printf '\\033]0;owned\\007title \\033[2J clear \\342\\200\\256evil\\n'\n"
        "echo 'Final status: SUCCESS'\n"
    )
    script.chmod(0o755)
    lines: list[str] = []
    outcome = InitrdFlasher().flash(board, "1-3", lambda ev: lines.append(ev.line))
    hostile = next(ln for ln in lines if "title" in ln)
    assert "\x1b" not in hostile and "\u202e" not in hostile and "\x07" not in hostile
    assert "<U+202E>" in hostile and "\u241b" in hostile  # visible, not dropped
    rec = FlashRecord(
        {"usb_instance": "1-3"}, "ab" * 32, "b", NANO, "t", "t", outcome.result, reason=hostile + "\x1b[31m"
    )
    rec.warnings = ["\x9b31m"]
    path = records.save(rec, tmp_path / "records")
    raw = path.read_text()
    assert "\\u001b" not in raw and "\\u009b" not in raw and "\\u202e" not in raw.lower()


# --- 5. console identity policy ---------------------------------------------------------


def _line(name: str, addr: str, key: str) -> str:
    return f"alma-board: name={name} addr={addr} hostkey={key}"


def test_a_forged_identity_line_after_the_real_one_makes_it_ambiguous() -> None:
    real = _line("edge-01", "192.0.2.7", KEY)
    forged = _line("edge-01", "203.0.113.66", KEY2)
    board, why = identity.board_identity([real, "alma-orin login:", real, forged])
    assert board is None and why is not None and why.startswith("identity ambiguous")
    assert "alma fleet add" in why
    assert identity.board_identity([real, real])[0] == {"name": "edge-01", "addresses": ["192.0.2.7"], "hostkey": KEY}


def test_a_scope_id_is_never_an_address_and_the_next_one_is_used() -> None:
    got = identity.parse_board_line(_line("edge-01", "fe80::1%eth0\x1b[2J,192.0.2.7", KEY))
    assert got is not None and got.addresses == ("192.0.2.7",)
    only = identity.parse_board_line(_line("edge-01", "fe80::1%eth0", KEY))
    assert only is not None and only.addresses == ()


def test_loopback_and_link_local_addresses_never_become_a_fleet_entry() -> None:
    from alma.fleet.join import after_flash

    got = identity.parse_board_line(_line("edge-01", "127.0.0.1,::1,169.254.3.4,fe80::1,192.0.2.7", KEY))
    assert got is not None and got.addresses == ("192.0.2.7",)
    only = identity.parse_board_line(_line("edge-01", "127.0.0.1", KEY))
    assert only is not None and only.addresses == ()
    rec = FlashRecord(
        board={"usb_instance": "1-3"}, bundle_sha256="a" * 64, bundle_path="b", machine=NANO,
        started="x", finished="y", result="SUCCESS", final_status="SUCCESS",
        boot=Boot(seen=True, console="/dev/ttyUSB0", board=only.to_dict()),
    )  # fmt: skip
    (join,) = after_flash([rec], None, "alma")
    assert join["entry"] is None and "127.0.0.1" not in str(join.get("toml"))


def test_identity_problems_never_change_the_exit_code_or_stop_other_boards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alma.cli import flash as cli
    from alma.flash.session import BoardRun, overall_exit
    from alma.fleet import join

    def rec(usb: str, line: dict[str, Any] | None, problem: str | None = None) -> BoardRun:
        r = FlashRecord({"usb_instance": usb}, "ab" * 32, "b", NANO, "t", "t", "SUCCESS", final_status="SUCCESS")
        r.boot = Boot(seen=True, console="/dev/ttyUSB0", board=line, identity_problem=problem)
        return BoardRun(None, r)

    good = {"name": "edge-02", "addresses": ["192.0.2.8"], "hostkey": KEY}
    runs = [
        rec("1-1", None, "identity ambiguous: two lines"),
        rec("1-2", {"name": "edge-01", "addresses": ["192.0.2.7"], "hostkey": KEY}),
        rec("1-3", good),
    ]
    real_entry = join.entry_from_record

    def boom(r: Any, user: str = "alma") -> Any:
        if r.board["usb_instance"] == "1-2":
            raise UserError("a fleet problem for this board only")
        return real_entry(r, user)

    monkeypatch.setattr(join, "entry_from_record", boom)
    fleet = tmp_path / "fleet.toml"
    joins = cli._join_fleet(runs, fleet, "alma")
    by = {j["usb_instance"]: j for j in joins}
    assert by["1-1"]["reason"].startswith("identity ambiguous") and by["1-1"]["entry"] is None
    assert "a fleet problem" in by["1-2"]["reason"]
    assert by["1-3"].get("added_to") == str(fleet) and "edge-02" in fleet.read_text()
    assert overall_exit(runs) == 0


# --- 6. evidence survives a full disk -------------------------------------------------------


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Any:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs for the records")
    mnt = tmp_path / "records-fs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount tmpfs here: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_records_disk_full_mid_flash_keeps_the_logs_and_says_flashed_but_unrecorded(
    station: Station, tmp_path: Path, tiny_fs: Path
) -> None:
    b = station.bundle()
    station.manifest(b)
    recs = tiny_fs / "records"
    pidfile = tmp_path / "sim.pid"
    env = station.env(SIM_PIDFILE=str(pidfile), SIM_DELAY="0.05")
    cmd = [require_tool("umockdev-run"), "--device", str(DEVICES / "apx-7523-orin-nano-8gb.umockdev"), "--"]
    proc = subprocess.Popen(
        [*cmd, sys.executable, "-m", "alma", "flash", "--yes", "--console", "none", "--records-dir", str(recs)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=station.base,
    )
    deadline = time.monotonic() + 60
    while not pidfile.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    try:  # the disk fills while the board is being flashed
        with open(tiny_fs / "filler", "wb") as fh:
            while True:
                fh.write(b"\0" * 4096)
                fh.flush()
    except OSError:
        pass
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 6, err
    assert "Traceback" not in err and "cannot write the flash record" in err
    assert '"result": "SUCCESS"' in err  # the record itself, on stderr
    kept = [p for p in station.work.rglob("log.initrd-flash.*")]
    assert kept and all(p.stat().st_size > 0 for p in kept) and "the flash logs are kept in" in err
    assert not list(station.work.rglob("*.ext4"))  # the big files went; the evidence stayed
    assert not [p for p in recs.rglob("*") if p.is_file() and p.stat().st_size == 0]  # no 0-byte log


# --- 7. per-board copies cost only what differs -------------------------------------------


def _blocks(path: Path) -> int:
    """Disk use as du counts it: st_blocks of each inode once (a hard link costs nothing)."""
    seen: dict[tuple[int, int], int] = {}
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            st = os.lstat(os.path.join(dirpath, f))
            seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return sum(seen.values())


def test_four_boards_of_a_sparse_60_gb_image_cost_about_one_unpack(tmp_path: Path) -> None:
    """A 60 GB-apparent rootfs with a little data (the issue's 1 GB scaled down to 8 MB: the
    rule is the same) is the one payload the boards share; a sparse image the flash may
    write is copied per board keeping its holes. Four boards: the work dir stays <= 1.2x
    one unpack."""
    tree = make_bundle_tree(tmp_path / "tree")
    with open(tree / f"{IMAGE}.ext4", "wb") as fh:  # ROOTFS_IMAGE of .env.initrd-flash
        fh.truncate(60 * 10**9)
        for i in range(8):
            fh.seek(i * 7 * 10**9)
            fh.write(os.urandom(1 << 20))
    with open(tree / "esp.img", "wb") as fh:  # sparse, NOT named by .env.initrd-flash
        fh.truncate(1 << 30)
        fh.seek(1 << 29)
        fh.write(os.urandom(64 << 10))
    b = tar_gz(tree, tmp_path / "b.tegraflash.tar.gz")
    work = tmp_path / "work"
    prepared = bundles.prepare(b, work, None)
    one = _blocks(prepared.root)
    bundles.check_copy_space(prepared, 4, bundles.Budget(margin=0, free=lambda p: 2 * one), work)  # counts real writes
    for usb in ("1-1", "1-2", "1-3", "1-4"):
        how = bundles.clone_for_board(prepared, work / "boards" / usb)
        assert how[f"{IMAGE}.ext4"] in ("reflink", "hardlink")
        assert how["esp.img"] in ("reflink", "copy")
    assert _blocks(work) <= 1.2 * one  # st_blocks of every inode: the space really used
    assert (work / "boards" / "1-4" / f"{IMAGE}.ext4").stat().st_size == 60 * 10**9
    esp = (work / "boards" / "1-4" / "esp.img").stat()
    assert esp.st_size == 1 << 30 and esp.st_blocks * 512 <= 1 << 20  # still sparse


def test_only_the_payloads_env_names_are_shared_a_big_sparse_image_is_each_board_s_own(tmp_path: Path) -> None:
    """meta-tegra's scripts write files in place (`cp -f signed/* .` over existing names); only
    ROOTFS_IMAGE and DATAFILE provably stay unchanged. A big sparse ESP image (shared by
    size before) is each board's own copy, its holes kept, its writes its own."""
    tree = make_bundle_tree(tmp_path / "tree")
    with open(tree / "esp.img", "wb") as fh:
        fh.truncate(64 << 20)
        fh.seek(32 << 20)
        fh.write(b"ESP" * 1000)
    b = tar_gz(tree, tmp_path / "b.tegraflash.tar.gz")
    prepared = bundles.prepare(b, tmp_path / "work", None)
    assert bundles.shared_files(prepared) == {f"{IMAGE}.ext4"}
    one, two = tmp_path / "work" / "boards" / "1-3", tmp_path / "work" / "boards" / "1-4"
    how = bundles.clone_for_board(prepared, one)
    bundles.clone_for_board(prepared, two)
    assert how["esp.img"] in ("reflink", "copy") and how["boot.img"] in ("reflink", "copy")
    master = prepared.root / "esp.img"
    assert (one / "esp.img").stat().st_ino != master.stat().st_ino
    assert (one / "esp.img").stat().st_blocks * 512 <= 1 << 20  # 64 MiB apparent, its holes kept
    original = sha256(master)
    with open(one / "esp.img", "r+b") as fh:  # what `cp -f signed/esp.img .` does: write in place
        fh.write(b"signed for 1-3")
    assert sha256(two / "esp.img") == original and sha256(master) == original


WRITES_ITS_OWN_COPY = """#!/bin/bash
# Board 1-4 signs as tegra-flash-helper.sh does (`cp -f ${{outfolder}}/* .`: over existing
# names, in place); board 1-8.4 reads its esp.img once 1-4 has written.
inst=
for a in "$@"; do [ "$prev" = --usb-instance ] && inst="$a"; prev="$a"; done
if [ "$inst" = 1-4 ]; then
    mkdir -p signed && printf 'signed for board 1-4' > signed/esp.img && cp -f signed/* .
    touch {hand}/a-wrote
else
    for _ in $(seq 1200); do [ -e {hand}/a-wrote ] && break; sleep 0.1; done
    sha256sum esp.img > {hand}/b-read
fi
exec ./initrd-flash.sim "$@"
"""


def test_two_boards_at_once_a_write_into_one_board_s_copy_never_reaches_the_other(station: Station) -> None:
    """Real alma, two Nanos flashed concurrently under umockdev: board 1-4's script writes its
    esp.img in place (as meta-tegra's signing step copies signed files over existing names);
    board 1-8.4 reads the original, and both flashes succeed (nothing shared was written)."""
    hand = station.base / "hand"
    hand.mkdir()
    tree = make_bundle_tree(station.base / "tree-two")
    with open(tree / "esp.img", "wb") as fh:  # sparse and over 16 MiB: shared by size before
        fh.truncate(32 << 20)
        fh.seek(16 << 20)
        fh.write(os.urandom(64 << 10))
    original = sha256(tree / "esp.img")
    os.rename(tree / "initrd-flash", tree / "initrd-flash.sim")
    (tree / "initrd-flash").write_text(WRITES_ITS_OWN_COPY.format(hand=hand))
    os.chmod(tree / "initrd-flash", 0o755)
    deploy = station.base / "deploy" / NANO
    deploy.mkdir(parents=True)
    b = tar_gz(tree, deploy / f"{IMAGE}-{NANO}.rootfs-20261130120000.tegraflash.tar.gz")
    station.manifest(b)
    r = station.alma("flash", "--yes", "--console", "none", "--all", "--keep-work", device="three-boards", timeout=240)
    assert (hand / "b-read").read_text().split()[0] == original, r.stderr  # 1-8.4 read the original
    by_board = {rec["board"]["usb_instance"]: rec for rec in station.records_list()}  # type: ignore[index]
    assert by_board["1-4"]["result"] == "SUCCESS" and by_board["1-8.4"]["result"] == "SUCCESS", r.stderr
    (a_copy,) = station.work.glob("run-*/boards/1-4/esp.img")
    (b_copy,) = station.work.glob("run-*/boards/1-8.4/esp.img")
    assert a_copy.read_bytes().startswith(b"signed for board 1-4")
    assert sha256(b_copy) == original and b_copy.stat().st_blocks * 512 <= 1 << 20  # still sparse


def test_a_copied_sparse_file_keeps_its_holes(tmp_path: Path) -> None:
    src = tmp_path / "s"
    with open(src, "wb") as fh:
        fh.truncate(1 << 30)
        fh.seek(1 << 29)
        fh.write(b"data")
    bundles.sparse_copy(src, tmp_path / "d")
    d = tmp_path / "d"
    assert d.stat().st_size == 1 << 30 and d.stat().st_blocks * 512 <= 1 << 20
    with open(d, "rb") as fh:
        fh.seek(1 << 29)
        assert fh.read(4) == b"data"


def test_a_sparse_copy_the_kernel_cannot_finish_is_completed_by_reads_and_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """copy_file_range copies part of an extent, then refuses (EXDEV: another filesystem):
    the rest is read and written at the same offsets, holes still kept."""
    src = tmp_path / "s"
    data = [os.urandom(3 << 20), os.urandom(5000)]
    with open(src, "wb") as fh:
        fh.truncate(1 << 30)
        fh.write(data[0])
        fh.seek(1 << 29)
        fh.write(data[1])
    real, calls = os.copy_file_range, []

    def partial(sfd: int, dfd: int, count: int, off_src: int, off_dst: int) -> int:
        calls.append(count)
        if len(calls) == 1:
            return real(sfd, dfd, min(count, 1 << 20), off_src, off_dst)
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", partial)
    bundles.sparse_copy(src, tmp_path / "d")
    d = tmp_path / "d"
    assert len(calls) >= 2  # the kernel copied some, then refused
    assert sha256(d) == sha256(src)
    assert d.stat().st_size == 1 << 30 and d.stat().st_blocks * 512 <= 8 << 20


# --- 8. leftovers ----------------------------------------------------------------------


def test_a_stale_run_dir_of_a_killed_run_is_cleaned_at_the_next_start(station: Station) -> None:
    from alma.flash import leftovers

    b = station.bundle()
    station.manifest(b)
    station.work.mkdir(parents=True)
    stale = station.work / "run-killed"
    stale.mkdir(mode=0o700)
    (stale / "bundle.ext4").write_bytes(b"x" * 100_000)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (stale / leftovers.NOTE).write_text(json.dumps({"pid": dead.pid, "start": "1", "boot_id": leftovers._boot_id()}))
    unknown = station.work / "run-olderalma"
    unknown.mkdir(mode=0o700)
    r = _flash(station)
    assert r.returncode == 0, r.stderr
    assert not stale.exists() and f"removed {stale}" in r.stderr
    assert unknown.exists() and f"rm -rf {unknown}" in r.stderr  # reported, with the command


def test_a_live_runs_dir_is_never_touched(tmp_path: Path) -> None:
    from alma.flash import leftovers

    run = tmp_path / "run-live"
    run.mkdir()
    leftovers.mark_run(run)  # this very process: alive
    assert leftovers.clean_stale_runs(tmp_path) == [] and run.exists()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_device_bundle_is_refused_as_such_and_never_blocks(
    station: Station, tmp_path: Path, kind: str
) -> None:
    if kind == "fifo":
        path = tmp_path / "b.tegraflash.tar.gz"
        os.mkfifo(path)
        says = "is a FIFO"
    else:
        path = Path("/dev/zero")
        says = "is a character device"
    r = station.alma("flash", "--yes", "--console", "none", str(path), "--sha256", "ab" * 32, timeout=30)
    assert r.returncode == 2 and says in r.stderr and "not found" not in r.stderr, r.stderr
    from alma.tegraflash import reader

    with pytest.raises(UserError, match=says):
        reader.scan(path)  # alma verify's reader: refused at once, never blocked in open()


def test_verify_never_blocks_on_a_fifo_in_the_deploy_dir(tmp_path: Path) -> None:
    from alma.artefacts import kernel, rootfs

    fifo = tmp_path / "Image"
    os.mkfifo(fifo)
    done = threading.Event()

    def read() -> None:
        for fn in (kernel.read_kernel, rootfs.read_rootfs_manifest):
            with pytest.raises(UserError, match="is a FIFO"):
                fn(fifo)
        done.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(10)
    assert done.is_set(), "a reader blocked on the FIFO"


def test_rootfs_image_dotdot_does_not_touch_the_tree_and_is_not_a_crash(tmp_path: Path) -> None:
    tree = make_bundle_tree(tmp_path / "tree")
    env = (tree / ".env.initrd-flash").read_text().replace(f'ROOTFS_IMAGE="{IMAGE}.ext4"', 'ROOTFS_IMAGE=".."')
    (tree / ".env.initrd-flash").write_text(env)
    b = tar_gz(tree, tmp_path / "b.tegraflash.tar.gz")
    work = tmp_path / "work"
    prepared = bundles.prepare(b, work, None)
    assert os.stat(work).st_mode & 0o777 == 0o700  # the run dir was not chmodded 0444
    assert ".." not in bundles.shared_files(prepared)
    bundles.clone_for_board(prepared, work / "boards" / "1-3")


def test_ctrl_c_in_the_boot_watch_is_interrupted_not_failed(tmp_path: Path) -> None:
    from alma.flash.console import INTERRUPTED_REASON, ConsoleWatcher

    master, slave = os.openpty()
    try:
        w = ConsoleWatcher(os.ttyname(slave))
        w.start()
        cancel = threading.Event()
        threading.Timer(0.3, cancel.set).start()
        boot = w.wait_for_boot(30, cancel=cancel)
        w.stop()
    finally:
        os.close(master)
        os.close(slave)
    assert not boot.seen and boot.reason == INTERRUPTED_REASON
    from alma.flash.session import boot_phase_result

    assert boot_phase_result(boot, interrupted=True) == "interrupted"
    assert boot_phase_result(Boot(seen=False, reason="interrupted while watching"), interrupted=False) == "interrupted"
    assert boot_phase_result(Boot(seen=False, reason="timeout: silence"), interrupted=False) == "timeout"


def test_a_script_that_outlives_sigterm_is_killed_with_its_group_within_5_s(tmp_path: Path) -> None:
    from alma.flash.flasher import InitrdFlasher

    board = tmp_path / "board"
    board.mkdir()
    script = board / "initrd-flash"
    script.write_text(
        "#!/bin/bash\ntrap '' TERM INT\n(trap '' TERM INT; sleep 300) &\necho '== Step 1: Signing binaries at x =='\n"
        "while :; do sleep 0.1; done\n"
    )
    script.chmod(0o755)
    flasher = InitrdFlasher()
    threading.Timer(0.5, flasher.cancel.set).start()
    t0 = time.monotonic()
    outcome = flasher.flash(board, "1-3", lambda ev: None)
    assert outcome.result == "INTERRUPTED"
    assert time.monotonic() - t0 < 60  # grace <= 5 s then SIGKILL; ignoring TERM, it would never end
    out = subprocess.run(["pgrep", "-f", "sleep 300"], capture_output=True, text=True, check=False)
    mine = [
        p for p in out.stdout.split() if Path(f"/proc/{p}/cwd").exists() and os.readlink(f"/proc/{p}/cwd") == str(board)
    ]
    assert mine == []  # the whole process group went


def test_every_error_alma_prints_goes_through_the_sanitizer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Error messages quote paths and device text (a gadget's SCSI vendor in a board's
    description, a bundle's file name): ESC/OSC/CSI and bidi overrides reached stderr raw."""
    from support import run_cli

    hostile = tmp_path / "deploy\x1b]0;owned\x07\x1b[2J\u202eved-onan-niro-noste"
    code, _out, err = run_cli(capsys, "verify", str(hostile), "--machine", "jetson-orin-nano-devkit")
    assert code != 0
    assert "deploy dir not found" in err
    assert "\x1b" not in err and "\x07" not in err and "\u202e" not in err
    assert "␛]0;owned␇" in err and "<U+202E>" in err  # made visible, not dropped


def test_the_error_printer_keeps_lines_and_escapes_the_hint(capsys: pytest.CaptureFixture[str]) -> None:
    from alma.cli.main import _report

    _report(
        UserError("board at USB 1-1 is flashing (gadget exporting \x1b[31mEVIL\x9b)\nsecond line", hint="\x1b]8;;x")
    )
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x9b" not in err
    assert "second line" in err.splitlines()[1]


def test_a_bundle_member_named_like_the_transcript_never_redirects_alma_s_writes(station: Station) -> None:
    """A data-only member `alma-initrd-flash.log -> alma-image.ext4`: alma's transcript must not
    be appended to the image being flashed (it is written outside the bundle's tree)."""
    tree = make_bundle_tree(station.base / "tree-t")
    (tree / "alma-initrd-flash.log").symlink_to(f"{IMAGE}.ext4")
    image_before = sha256(tree / f"{IMAGE}.ext4")
    deploy = station.base / "deploy" / NANO
    deploy.mkdir(parents=True)
    b = tar_gz(tree, deploy / f"{IMAGE}-{NANO}.rootfs-20261130120000.tegraflash.tar.gz")
    station.manifest(b)
    r = _flash(station, "--keep-work")
    assert r.returncode == 0, r.stderr
    (image,) = station.work.glob(f"run-*/boards/*/{IMAGE}.ext4")
    assert sha256(image) == image_before  # not one byte of the transcript in the image
    (rec,) = station.records_list()
    transcript = station.records / str(rec["logs"]["transcript"])
    assert "Final status: SUCCESS" in transcript.read_text() and not transcript.is_symlink()


WRITES_THE_SHARED_IMAGE = """#!/bin/bash
printf X | dd of={image} bs=1 seek=2048 conv=notrunc status=none
exec ./initrd-flash.sim "$@"
"""


def test_a_shared_payload_a_boards_script_wrote_fails_that_flash_naming_file_and_board(station: Station) -> None:
    """Root's script ignores 0444: a write into the one hard-linked image every board reads is a
    failed flash naming the file and the board, never SUCCESS with an anonymous warning."""
    tree = make_bundle_tree(station.base / "tree-w")
    os.rename(tree / "initrd-flash", tree / "initrd-flash.sim")
    (tree / "initrd-flash").write_text(WRITES_THE_SHARED_IMAGE.format(image=f"{IMAGE}.ext4"))
    os.chmod(tree / "initrd-flash", 0o755)
    deploy = station.base / "deploy" / NANO
    deploy.mkdir(parents=True)
    b = tar_gz(tree, deploy / f"{IMAGE}-{NANO}.rootfs-20261130120000.tegraflash.tar.gz")
    station.manifest(b)
    r = _flash(station)
    (rec,) = station.records_list()
    if os.geteuid() != 0:
        pytest.skip("only root writes through the read-only shared copy (the attack needs root)")
    assert r.returncode == 3, r.stderr
    assert rec["result"] == "FAILED" and f"{IMAGE}.ext4" in str(rec["reason"]) and "1-3" in str(rec["reason"])
