"""The small parts: reasons from real initrd-flash transcripts, the .env parser, the
bundle/board match, the flock, and the udev rules `alma setup udev` writes."""

from __future__ import annotations

import fcntl
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support_flash import Station

from alma.errors import UserError
from alma.flash import reasons, udev_rules
from alma.flash.lock import BoardLock
from alma.flash.match import check_fits
from alma.flash.pids import MODULES
from alma.tegraflash.envfile import parse_env

# A real transcript (OE4T/tegra-demo-distro issue 306, scarthgap, Orin Nano devkit).
STUCK = """Starting at 2024-08-19T13:53:04-07:00
Machine:       jetson-orin-nano-devkit
Rootfs device: mmcblk0p1
Found Jetson device in recovery mode at USB 1-8.4
== Step 1: Signing binaries at 2024-08-19T13:53:05-07:00 ==
== Step 2: Boot Jetson via RCM at 2024-08-19T13:53:18-07:00 ==
Found Jetson device in recovery mode at USB 1-8.4
== Step 3: Sending flash sequence commands at 2024-08-19T13:53:22-07:00 ==
Waiting for USB storage device flashpkg from 1137aeb0.......[/dev/sda]
Device size in blocks: 262144
Unmounted /dev/sda.
== Step 4: Writing partitions on internal storage device at 2024-08-19T13:53:45-07:00 ==
""".splitlines()

# tegrarcm_v2's failure in the host log (OE4T/meta-tegra issue 1824).
USB_WRITE = """[   0.1171 ] Sending bct_br
[   0.1213 ] ERROR: might be timeout in USB write.
Error: Return value 3
Command tegrarcm_v2 --instance 1-6 --new_session --chip 0x23 0 --uid --download bct_br br_bct_BR.bct
ERR: RCM boot failed at 2025-01-29T22:07:40+01:00""".splitlines()


def test_reason_for_a_storage_wait_that_never_ended() -> None:
    why = reasons.reason_from_log(STUCK, timed_out_phase="flash", timeout_s=3600, waiting_for="mmcblk0")
    assert why.startswith("storage device mmcblk0 never appeared")
    assert "3600 s" in why and "automount" in why
    # the resolved flashpkg wait of step 3 is not mistaken for the pending one
    assert "flashpkg" not in why.split("(")[0]


def test_reason_for_an_unresolved_complete_waiting_line() -> None:
    lines = [*STUCK, "Waiting for USB storage device nvme0n1 from 1137aeb0........"]
    why = reasons.reason_from_log(lines, timed_out_phase="flash")
    assert why.startswith("storage device nvme0n1 never appeared")


def test_reason_usb_write_timeout_wins() -> None:
    why = reasons.reason_from_log(USB_WRITE, usb_instance="1-6")
    assert "might be timeout in USB write" in why and "no hub" in why


def test_reason_final_status_failed() -> None:
    lines = ["== Step 5: Waiting for final status from device at x ==", "Final status: FAILED", "Host-side log: y"]
    assert reasons.final_status(lines) == "FAILED"
    why = reasons.reason_from_log(lines)
    assert "Final status: FAILED" in why and "exited 0" in why


def test_reason_no_board() -> None:
    why = reasons.reason_from_log(["ERR: No Jetson device in recovery mode found at USB 1-8.4"], usb_instance="1-8.4")
    assert why.startswith("no Jetson in recovery mode at USB 1-8.4")


def test_reason_falls_back_to_the_first_err_line() -> None:
    assert reasons.reason_from_log(["blah", "ERR: chip_info.bin_bak missing after dumping boardinfo"]) == (
        "ERR: chip_info.bin_bak missing after dumping boardinfo"
    )


ENV = """FLASH_HELPER=tegra-flash-helper.sh
BOOTDEV="nvme0n1p1"
ROOTFS_DEVICE="nvme0n1"
CHIPID="0x23"
MACHINE="p3768-0000-p3767-0000"
DEFAULTS[BOARDID]="3767"
DEFAULTS[FAB]="300"
ODMDATA="gbe-uphy-config-8,hsstp-lane-map-3"
ROOTFS_IMAGE="alma-image.ext4"
DATAFILE=""
EXTERNAL_ROOTFS_DRIVE=1
"""


def test_env_is_parsed_not_executed() -> None:
    env = parse_env(ENV)
    assert env.machine == "p3768-0000-p3767-0000"
    assert env.chipid == "0x23" and env.rootfs_device == "nvme0n1" and env.bootdev == "nvme0n1p1"
    assert env.defaults == {"BOARDID": "3767", "FAB": "300"}
    assert env.payload_files() == ["alma-image.ext4"]
    # bash would run this when initrd-flash sources the file: not a value, a refusal
    with pytest.raises(UserError, match="not one plain shell word"):
        parse_env(ENV + 'EVIL="$(touch /tmp/alma-pwned)"\n')
    assert not Path("/tmp/alma-pwned").exists()


AGX = ENV.replace("p3768-0000-p3767-0000", "jetson-agx-orin-devkit")
# Lines bash and str.splitlines/shlex read differently, and lines that run commands when sourced.
TWO_READINGS = {
    "fs-separator": AGX + "ROOTFS_IMAGE=x\x1cMACHINE=jetson-orin-nano-devkit\n",
    "line-separator": AGX + "ROOTFS_IMAGE=x\u2028MACHINE=jetson-orin-nano-devkit\n",
    "carriage-return": AGX + "ROOTFS_IMAGE=x\rMACHINE=jetson-orin-nano-devkit\n",
    "command-word": ENV + "ROOTFS_DEVICE2=mmcblk0 touch {pwned}\n",
    "semicolon": ENV + "X=1;touch {pwned}\n",
    "substitution": ENV + 'X="`touch {pwned}`"\n',
    "escape": ENV + 'ROOTFS_IMAGE2="a\x1b[2Jb"\n',
    "nul": ENV + 'X="a\x00b"\n',
    "glob": ENV + "X=/tm*\n",
    "tilde": ENV + "X=~root\n",
    "set-twice": ENV + "MACHINE=jetson-orin-nano-devkit\n",
    "export": ENV + "export X=1\n",
}


def _bash_reading(text: str, tmp_path: Path) -> dict[str, str]:
    """What initrd-flash sees: bash sources the file (as the real script does) and prints the values."""
    f = tmp_path / "env"
    f.write_bytes(text.encode("utf-8", "surrogatepass"))
    keys = sorted({ln.split("=", 1)[0] for ln in text.split("\n") if "=" in ln and "[" not in ln.split("=", 1)[0]})
    script = 'declare -A DEFAULTS; source "$1"; ' + " ".join(
        f'printf "%s\\0" "${{{k}-}}";' for k in keys if k.isidentifier()
    )
    out = subprocess.run(["bash", "-c", script, "bash", str(f)], capture_output=True, check=False).stdout
    return dict(zip([k for k in keys if k.isidentifier()], out.decode("utf-8", "replace").split("\0"), strict=False))


@pytest.mark.parametrize("kind", sorted(TWO_READINGS))
def test_env_lines_bash_reads_otherwise_are_refused(kind: str, tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    text = TWO_READINGS[kind].format(pwned=pwned)
    bash = _bash_reading(text, tmp_path)
    with pytest.raises(UserError) as ei:
        parse_env(text)
    assert len(ei.value.message) < 500 and "\x1b" not in ei.value.message and "\x00" not in ei.value.message
    if kind == "fs-separator":
        assert bash["MACHINE"] == "jetson-agx-orin-devkit"  # what the script ran with: the fit check must see it
    if kind == "command-word":
        assert pwned.exists()  # bash ran the command word: why it can never be a value


def test_what_the_parser_accepts_is_what_bash_sources(tmp_path: Path) -> None:
    text = ENV + "ODD='single $x'\nMIX=a\"b c\"'d'\nEMPTY=\nPATHY=/a/b:c,d+e@f%g=h\n"
    env = parse_env(text)
    bash = _bash_reading(text, tmp_path)
    assert {k: env.get(k) for k in bash} == bash
    assert env.get("MIX") == "ab cd" and env.get("ODD") == "single $x"


def test_a_huge_value_is_refused_with_a_short_message() -> None:
    with pytest.raises(UserError) as ei:
        parse_env(ENV + "ROOTFS_IMAGE2=" + "A" * 60_000 + "\n")
    assert "60000 bytes" in ei.value.message and len(ei.value.message) < 300


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("MACHINE=\n", "no MACHINE"),
        ("echo hi\n", "not a KEY=value"),
        ('MACHINE="unterminated\n', "not one plain shell word"),
    ],
)
def test_bad_env_is_a_clear_error(text: str, says: str) -> None:
    with pytest.raises(UserError) as ei:
        parse_env(text)
    assert says in ei.value.message


def test_every_orin_machine_fits_its_module_and_no_other() -> None:
    for pid, module in MODULES.items():
        for machine in module.machines:
            check_fits(machine, "0x23", "0955", pid, "1-1")
            for other_pid, other in MODULES.items():
                if other_pid != pid and other.flashable and machine not in other.machines:
                    with pytest.raises(UserError):
                        check_fits(machine, "0x23", "0955", other_pid, "1-1")


def test_mismatch_names_bundle_and_board() -> None:
    with pytest.raises(UserError) as ei:
        check_fits("jetson-agx-orin-devkit", "0x23", "0955", "7523", "1-8.4")
    msg = ei.value.message
    assert "jetson-agx-orin-devkit" in msg and "Jetson AGX Orin" in msg and "Jetson Orin Nano" in msg and "1-8.4" in msg


def test_wrong_chip_and_old_boards_and_unknown_machines() -> None:
    with pytest.raises(UserError, match="chip 0x19"):
        check_fits("jetson-orin-nano-devkit", "0x19", "0955", "7523", "1-3")
    with pytest.raises(UserError, match="supports Orin only"):
        check_fits("jetson-orin-nano-devkit", "0x23", "0955", "7f21", "1-3")
    with pytest.raises(UserError, match="unknown MACHINE"):
        check_fits("my-custom-carrier", "0x23", "0955", "7523", "1-3")


def _node(tmp_path: Path, name: str = "007") -> str:
    """A temp file standing for the board's USB device node (/dev/bus/usb/001/007): flock
    works the same on both; mode 0666 like a node any plugdev member may open."""
    p = tmp_path / name
    p.write_bytes(b"")
    p.chmod(0o666)
    return str(p)


def test_lock_refuses_a_second_flasher_and_frees_on_exit(tmp_path: Path) -> None:
    node = _node(tmp_path)
    with BoardLock("1-8.4", node):
        with pytest.raises(UserError) as ei:
            BoardLock("1-8.4", node).acquire()
        assert "already being flashed" in ei.value.message and node in ei.value.message
        BoardLock("1-3", _node(tmp_path, "008")).acquire()  # another board is independent
    BoardLock("1-8.4", node).acquire()  # released


def test_lock_means_the_board_for_every_user_and_never_goes_stale(tmp_path: Path) -> None:
    """Held by another process; a second flasher of the same node is refused (flock ignores
    who opened the node, so any user is); kill -9 of the holder frees it (no lock file)."""
    node = _node(tmp_path)
    tmp_path.chmod(0o755)
    code = (
        "import sys; from alma.flash.lock import BoardLock; "
        f"BoardLock('1-3', {node!r}).acquire(); print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match="already being flashed"):
            BoardLock("1-3", node).acquire()
    finally:
        holder.kill()
        holder.wait()
    BoardLock("1-3", node).acquire()  # the flock died with its process: no stale lock
    fd = os.open(node, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_lock_without_a_device_node_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no USB device node"):
        BoardLock("1-3", None).acquire()
    with pytest.raises(UserError) as ei:
        BoardLock("1-3", str(tmp_path / "gone")).acquire()
    assert "left recovery mode" in str(ei.value.hint)


# udev rules: one line per rule, KEY{attr}OP"value" pairs separated by ", "
_PAIR = re.compile(r'^[A-Z_]+(\{[A-Za-z_]+\})?(==|!=|=|\+=|:=)"[^"]*"$')


def test_rules_cover_every_recovery_pid_and_the_gadget() -> None:
    text = udev_rules.render()
    rules = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    for ln in rules:
        for pair in ln.split(", "):
            assert _PAIR.match(pair), (pair, ln)
        assert 'GROUP="plugdev"' in ln and 'MODE="0660"' in ln
    # pinned from docs/flash.md (APX ids, vendor 0955), not from the code under test
    recovery = {"7023", "7223", "7323", "7423", "7523", "7623", "7019", "7e19", "7f21", "7c18"}
    assert recovery <= set(MODULES)
    for pid in recovery:
        assert any(f'ATTR{{idProduct}}=="{pid}"' in ln and 'ATTR{idVendor}=="0955"' in ln for ln in rules), pid
    assert any('ATTR{idVendor}=="1d6b"' in ln and 'ATTR{idProduct}=="0104"' in ln for ln in rules)
    assert any('ENV{UDISKS_AUTO}="0"' in ln for ln in rules)


def test_setup_udev_writes_atomically_where_told(station: Station, tmp_path: Path) -> None:
    rules_dir = tmp_path / "rules.d"
    r = station.alma("setup", "udev", "--rules-dir", str(rules_dir), device=None)
    assert r.returncode == 0, r.stderr
    path = rules_dir / udev_rules.RULES_NAME
    assert path.read_text() == udev_rules.render()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in rules_dir.iterdir()] == [udev_rules.RULES_NAME]  # no temp files left
    assert "udevadm control --reload && sudo udevadm trigger" in r.stdout
    printed = station.alma("setup", "udev", "--print", device=None)
    assert printed.stdout == udev_rules.render()


@pytest.mark.parametrize(
    "group",
    ["plugdev\", RUN+=\"/bin/sh -c 'id > /tmp/pwned'", 'plugdev\nACTION=="add", RUN+="/bin/true"', "-x", "g" * 40],
)
def test_setup_udev_group_must_be_a_group_name(station: Station, tmp_path: Path, group: str) -> None:
    rules_dir = tmp_path / "rules.d"
    r = station.alma("setup", "udev", "--rules-dir", str(rules_dir), "--group", group, device=None)
    assert r.returncode == 2 and "not a group name" in r.stderr, r.stderr
    assert not rules_dir.exists() or list(rules_dir.iterdir()) == []
    assert "RUN+=" not in r.stdout and "usermod" not in r.stdout


def test_setup_udev_group_must_exist_and_the_hint_is_quoted(station: Station, tmp_path: Path) -> None:
    rules_dir = tmp_path / "rules.d"
    missing = "nogroup-" + os.urandom(4).hex()
    r = station.alma("setup", "udev", "--rules-dir", str(rules_dir), "--group", missing, device=None)
    assert r.returncode == 2 and "no such group" in r.stderr and f"groupadd {missing}" in r.stderr, r.stderr
    ok = station.alma("setup", "udev", "--rules-dir", str(rules_dir), "--group", "root", device=None)
    assert ok.returncode == 0, ok.stderr
    assert 'usermod -aG root "$USER"' in ok.stdout


def test_setup_udev_unwritable_dir_is_exit_2_with_sudo_hint(station: Station, tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # root ignores permissions: a path under a regular file cannot be created either
        blocker = tmp_path / "file"
        blocker.write_text("")
        r = station.alma("setup", "udev", "--rules-dir", str(blocker / "rules.d"), device=None)
        assert r.returncode == 2 and "Traceback" not in r.stderr and "Not a directory" in r.stderr
        return
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    r = station.alma("setup", "udev", "--rules-dir", str(ro), device=None)
    assert r.returncode == 2 and "sudo alma setup udev" in r.stderr


# -- which bundle, which hash ------------------------------------------------------------


def _opts(station: Station, **kw: object):  # type: ignore[no-untyped-def]
    from alma.flash.session import FlashOptions

    return FlashOptions(root=station.root, **kw)  # type: ignore[arg-type]


def test_bundle_comes_from_the_only_manifest(station: Station) -> None:
    from support_flash import sha256

    from alma.flash.session import resolve_bundle

    b = station.bundle()
    station.manifest(b)
    choice = resolve_bundle(_opts(station))
    assert choice.path == b and choice.expected_sha256 == sha256(b) and choice.machine == "jetson-orin-nano-devkit"


def test_several_manifests_need_machine_or_a_bundle_path(station: Station) -> None:
    from alma.flash.session import resolve_bundle

    nano = station.bundle("n")
    agx = station.bundle("a", machine="jetson-agx-orin-devkit")
    station.manifest(nano)
    station.manifest(agx, "jetson-agx-orin-devkit")
    with pytest.raises(UserError, match="several facts manifests fit"):
        resolve_bundle(_opts(station))
    assert resolve_bundle(_opts(station, machine="jetson-agx-orin-devkit")).path == agx
    # an explicit bundle finds its manifest by path
    assert resolve_bundle(_opts(station, bundle=nano)).machine == "jetson-orin-nano-devkit"


def test_relative_bundle_path_is_relative_to_the_repo(station: Station) -> None:
    import json as _json

    from alma.flash.session import resolve_bundle

    b = station.bundle()
    m = station.manifest(b)
    data = _json.loads(m.read_text())
    rel = os.path.relpath(b, station.root)
    data["facts"]["bundle_path"]["value"] = rel
    m.write_text(_json.dumps(data))
    assert resolve_bundle(_opts(station)).path.resolve() == b.resolve()


def test_sha256_option_must_agree_with_the_manifest(station: Station) -> None:
    from alma.flash.session import resolve_bundle

    b = station.bundle()
    station.manifest(b)
    with pytest.raises(UserError, match="contradicts the facts manifest"):
        resolve_bundle(_opts(station, sha256="00" * 32))


def test_manifest_without_bundle_hash_is_refused(station: Station) -> None:
    import json as _json

    from alma.flash.session import resolve_bundle

    b = station.bundle()
    m = station.manifest(b)
    data = _json.loads(m.read_text())
    data["facts"]["bundle_sha256"]["value"] = None
    m.write_text(_json.dumps(data))
    with pytest.raises(UserError) as ei:
        resolve_bundle(_opts(station))
    assert "bundle_sha256 is empty" in ei.value.message and "alma verify" in str(ei.value.hint)


def test_protocol_phases_and_when_the_board_must_be_on_usb() -> None:
    """From the real transcript: flashpkg ends at its '[/dev/sda]', storage starts at step 4;
    the board must stay on USB only from the storage device's '[/dev/sdX]' to '[OK: ...]'."""
    from alma.flash.protocol import Tracker

    clock = iter(range(100))
    seen: list[str] = []
    t = Tracker(seen.append, clock=lambda: float(next(clock)))
    for line in STUCK:
        t.feed(line)
    assert seen == ["sign", "rcm-boot", "flashpkg", "send-commands", "storage"]
    assert t.present_windows == []  # the gadget's power-off after step 3 is no time to be present
    t.feed("Waiting for USB storage device mmcblk0 from 1137aeb0...")
    t.feed("[/dev/sdb]")
    assert seen[-1] == "flash" and t.last_wait == "mmcblk0"
    t.feed("  Writing alma-image.ext4 (size=15032385536) to /dev/sdb1 (size=15032385536)...")
    start = t.present_windows[0][0]
    assert start is not None and t.must_be_present_at(start + 0.5)
    t.feed("[OK: /dev/sdb]")
    end = t.present_windows[0][1]
    assert end is not None and not t.must_be_present_at(end + 0.5)  # the host powers it off now


def test_reason_after_got_flashpkg_never_points_at_device_logs() -> None:
    lines = [*STUCK, "Waiting for USB storage device mmcblk0 from 1137aeb0...[got flashpkg when expecting mmcblk0]"]
    why = reasons.reason_from_log([*lines, "ERR: could not find mmcblk0"], device_logs=False)
    assert "flashpkg when mmcblk0 was expected" in why and "see the device logs" not in why
    assert "fetched no device logs" in why


def test_reason_for_the_flashpkg_wait_names_rcm_boot_and_the_usb_timeout() -> None:
    lines = [*STUCK[:8], "Waiting for USB storage device flashpkg from 1137aeb0...", *USB_WRITE[:3]]
    why = reasons.reason_from_log(lines, timed_out_phase="flashpkg", timeout_s=120)
    assert why.startswith("the flashpkg USB gadget never appeared within 120 s")
    assert "might be timeout in USB write" in why and "rcm-boot.sh still exits 0" in why
    quiet = reasons.reason_from_log(STUCK[:8], timed_out_phase="flashpkg", timeout_s=120)
    assert "did not boot the flashing kernel" in quiet


def test_final_failed_points_at_device_logs_only_when_there_are_some() -> None:
    lines = ["Final status: FAILED"]
    assert "see the device logs" in reasons.reason_from_log(lines, device_logs=True)
    assert "sent no logs" in reasons.reason_from_log(lines, device_logs=False)
