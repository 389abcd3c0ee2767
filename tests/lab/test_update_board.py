"""`alma update` on virtual boards: the command unmodified, over real ssh, against two boards
under real systemd with the image's units, users and OTA configuration; the real SWUpdate
(Debian's, the boards' lower layer) writes the inactive slot file (``/dev/disk/by-partlabel``),
the board's alma-ota and its settle unit finish what they are given, and the lab's
supervisor boots whatever the slot holds (docs/lab.md): a reboot is a real container restart,
a power cut kills every process of the board at once.

The two boards are shared by this module (booting is the slow part); every test starts from
a settled board (no lock, nothing pending) and ships a version newer than any before it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import require_tool
from support_lab import sh, virtual_fleet, wait_for
from support_update import REPO, alma, desktop_env, make_cert, make_swu, records

from alma.lab import board as lab
from alma.lab import machine
from alma.update import records as R

pytestmark = pytest.mark.slow

# The admin runs the agent through the image's sudo rule, as health (the fleet file's command).
AGENT = ["--agent", "sudo -n alma-ota"]
# Hang guards only: every wait returns as soon as its effect holds.
FAST = ["--poll", "0.5", "--boot-timeout", "300"]
SLOT = {"a": 0, "b": 1}
_versions = itertools.count(1)


@dataclass
class Lab:
    fleet: Path
    boards: list[lab.Board]
    signer: tuple[bytes, bytes]
    base: Path


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    require_tool("swupdate")  # the boards' SWUpdate is this host's (their lower layer)
    require_tool("cpio")  # meta-swupdate's packing of the .swu
    base = tmp_path_factory.mktemp("lab-update")
    signer = make_cert(base / "signer", "ALMA-OS lab fleet OTA")
    with virtual_fleet(2, ota_cert=signer[0]) as (fleet, boards):
        yield Lab(fleet, boards, signer, base)


@pytest.fixture
def settled(two: Lab) -> Iterator[Lab]:
    """Both boards settled before the test; after it, whatever it left is let go (abort)."""
    for b in two.boards:
        st = status(b)
        assert st["lock"] is None and st["pending"] is None, f"{b.name} not settled: {st}"
    yield two
    for b in two.boards:
        st = status(b)
        if st["lock"] is not None or st["pending"] is not None:
            out = json.loads(sh(b, "alma-ota", "abort").splitlines()[-1])
            if out.get("reboot_needed"):
                b.reboot()


def status(b: lab.Board) -> dict[str, Any]:
    """``alma-ota status`` on the board (as root, no login)."""
    got: dict[str, Any] = json.loads(sh(b, "alma-ota", "status").splitlines()[-1])
    return got


def uefi(b: lab.Board) -> dict[str, Any]:
    """The board's rootfs slot state as its bootloader keeps it (outside the board)."""
    got: dict[str, Any] = machine.slots(b.slot_dir)["rootfs"]
    return got


def new_swu(two: Lab, name: str, **img: object) -> tuple[Path, str]:
    version = f"1.{next(_versions)}.0"
    d = two.base / f"{name}-{version}"
    d.mkdir()
    return make_swu(d, two.signer, version, **img), version


def update(desk: Path, two: Lab, swu: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return alma(desk, "update", str(swu), "--fleet", str(two.fleet), "--json", *AGENT, *FAST, *args)


@contextlib.contextmanager
def update_running(desk: Path, two: Lab, swu: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """``alma update`` in the background (its own process group: a desktop killed is all of it)."""
    argv = [sys.executable, "-m", "alma", "update", str(swu), "--fleet", str(two.fleet), "--json", *AGENT, *FAST]
    p = subprocess.Popen(
        [*argv, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=desktop_env(desk), cwd=REPO, start_new_session=True,
    )  # fmt: skip
    try:
        yield p
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.communicate()


def record(desk: Path, swu: Path, node: str) -> R.UpdateRecord | None:
    with contextlib.suppress(Exception):  # not written yet, or mid-run
        return records(desk, swu).get(node)  # type: ignore[no-any-return]
    return None


def wait_phase(desk: Path, swu: Path, node: str, name: str, *, done: bool = False) -> R.UpdateRecord:
    """Wait until ``node``'s record shows phase ``name`` begun (or finished ok, ``done``)."""

    def seen() -> R.UpdateRecord | None:
        rec = record(desk, swu, node)
        if rec is None:
            return None
        hit = [p for p in rec.phases if p.name == name and (not done or p.result == "ok")]
        return rec if hit else None

    got = wait_for(f"{node}: phase {name}{' done' if done else ''}", seen, timeout=300)
    assert isinstance(got, R.UpdateRecord)
    return got


def finished(p: subprocess.Popen[str], timeout: float = 900) -> tuple[int, dict[str, Any]]:
    out, err = p.communicate(timeout=timeout)
    try:
        return p.returncode, json.loads(out)
    except ValueError:
        raise AssertionError(f"alma update exit {p.returncode}: {out}{err}") from None


def board_result(r: subprocess.CompletedProcess[str] | dict[str, Any], node: str) -> dict[str, Any]:
    doc = r if isinstance(r, dict) else json.loads(r.stdout)
    [got] = [b for b in doc["boards"] if b["node"] == node]
    return got  # type: ignore[no-any-return]


def cut(b: lab.Board) -> None:
    """Pull the power whenever the board is (booting or up): PID 1 of the container killed."""
    pid = wait_for(f"{b.name} powered", b.init_pid, timeout=300)
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(str(pid)), signal.SIGKILL)


def board_procs(b: lab.Board, comm: str) -> list[int]:
    """Host pids of the board's processes named ``comm`` (same pid namespace as its PID 1)."""
    init = b.init_pid()
    if init is None:
        return []
    ns = os.readlink(f"/proc/{init}/ns/pid")
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        with contextlib.suppress(OSError):
            if Path(f"/proc/{d}/comm").read_text().strip() == comm and os.readlink(f"/proc/{d}/ns/pid") == ns:
                out.append(int(d))
    return out


def assert_runs(b: lab.Board, slot: str, version: str) -> None:
    """The board booted ``slot``, reports ``version``, and holds nothing (no lock, no pending)."""
    st = status(b)
    assert (st["current_slot"], st["version"]) == (slot, version), st
    assert st["lock"] is None and st["pending"] is None, st
    assert uefi(b)["successful"][SLOT[slot]] is True, uefi(b)


def identity(b: lab.Board) -> tuple[str, str]:
    """The board's hostname (kernel and /etc/hostname, which must agree) and the host key its
    sshd offers, as the desktop sees it over ssh (the pinned key, strict checking)."""
    out = runner_ssh(b, ["sh", "-c", "hostname; cat /etc/hostname"]).split()
    assert len(out) == 2 and out[0] == out[1], out
    scan = subprocess.run(
        ["ssh-keyscan", "-t", "ed25519", "-p", str(b.port), "127.0.0.1"], capture_output=True, text=True, timeout=60
    )
    key = " ".join(scan.stdout.split()[1:3])
    return out[0], key


def runner_ssh(b: lab.Board, command: list[str], *, key: str = "id_ed25519") -> str:
    """``command`` as the admin over ssh with the lab's pinned host keys (strict) and only ``key``."""
    argv = [
        "ssh", "-p", str(b.port), "-o", f"UserKnownHostsFile={b.lab / 'known_hosts'}",
        "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
        "-o", "LogLevel=ERROR", "-i", str(b.lab / key), f"{lab.ADMIN}@127.0.0.1", *command,
    ]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"ssh to {b.name} with {key}: {r.stderr}"
    return r.stdout


def assert_same_identity(b: lab.Board, before: tuple[str, str]) -> None:
    """Hostname and host key as before; the flash-time admin key still lets the admin in."""
    assert identity(b) == before
    assert before[0] == b.name
    assert runner_ssh(b, ["id", "-un"], key=lab.FLASH_KEY).strip() == lab.ADMIN


def other(slot: str) -> str:
    return "b" if slot == "a" else "a"


# ---- the tests ----------------------------------------------------------------------------------


def test_update_reboot_health_commit_on_two_boards(settled: Lab, tmp_path: Path) -> None:
    """One wave of both boards: SWUpdate writes each inactive slot, each reboots into it (a
    new boot id), proves healthy and is committed; each then runs and reports the new image."""
    two = settled
    before = {b.name: status(b) for b in two.boards}
    ident = {b.name: identity(b) for b in two.boards}
    swu, version = new_swu(two, "commit")
    r = update(tmp_path, two, swu, "--canary", "0", "--batch", "2", "--health-timeout", "120")
    assert r.returncode == 0, r.stdout + r.stderr
    for b in two.boards:
        got = board_result(r, b.name)
        assert got["result"] == "COMMITTED", got
        assert [p["name"] for p in got["phases"]] == ["check", "lock", "push", "install", "reboot", "wait", "health",
                                                      "commit"]  # fmt: skip
        new = other(before[b.name]["current_slot"])
        assert_runs(b, new, version)
        assert status(b)["boot_id"] != before[b.name]["boot_id"]
        assert machine.read_header(b.disk_dir, SLOT[new]) == {"version": version, "health": "ok", "boots": True}
        assert uefi(b)["successful"] == [True, True]
        assert_same_identity(b, ident[b.name])  # the new slot's /etc was the image's


def test_a_sick_image_is_rolled_back_and_five_power_cuts_later_the_old_slot_still_boots(
    settled: Lab, tmp_path: Path
) -> None:
    b = settled.boards[0]
    old = status(b)
    ident = identity(b)
    swu, _ = new_swu(settled, "sick", health="critical")
    # the window is always waited out on a CRITICAL image: long enough for an answer under load
    r = update(tmp_path, settled, swu, "--node", b.name, "--health-timeout", "60")
    assert r.returncode == 1, r.stdout + r.stderr
    got = board_result(r, b.name)
    assert got["result"] == "ROLLED_BACK" and "health CRITICAL" in got["reason"], got
    assert machine.SICK_LINK in got["reason"], got  # the sick image's own fault, named
    assert_runs(b, old["current_slot"], old["version"])
    sick = SLOT[other(old["current_slot"])]
    assert uefi(b)["slots"][sick]["status"] == "unbootable", uefi(b)
    assert_same_identity(b, ident)  # the old slot's identity, intact
    for _ in range(5):
        b.reboot(power_cut=True)
        assert_runs(b, old["current_slot"], old["version"])
    assert_same_identity(b, ident)


def test_a_fallback_during_the_health_window_is_rolled_back_with_the_truth(settled: Lab, tmp_path: Path) -> None:
    """The new slot keeps losing power during the health window until its retries are spent;
    the bootloader falls back; the record says so and the board holds nothing."""
    b = settled.boards[1]
    old = status(b)
    swu, _ = new_swu(settled, "fallback", health="critical")  # never healthy: no commit can race the cuts
    with update_running(tmp_path, settled, swu, "--node", b.name, "--health-timeout", "900") as p:
        wait_phase(tmp_path, swu, b.name, "health")
        new = SLOT[other(old["current_slot"])]
        while uefi(b)["current"] == new:  # each boot of the uncommitted slot spends a retry
            b.reboot(power_cut=True)
        rc, doc = finished(p)
    got = board_result(doc, b.name)
    assert rc == 1 and got["result"] == "ROLLED_BACK", got
    assert (
        f"fell back during the health check: the bootloader fell back to slot {old['current_slot']}" in got["reason"]
        and f"running {old['version']} on slot {old['current_slot']}" in got["reason"]
    ), got
    assert_runs(b, old["current_slot"], old["version"])
    last = json.loads(sh(b, "cat", "/data/alma-ota/last.json"))
    assert last["result"] == "ROLLED_BACK" and "the bootloader fell back" in last["why"], last


def test_a_power_cut_while_installing_then_the_same_command_finishes(settled: Lab, tmp_path: Path) -> None:
    """The power goes while SWUpdate writes the inactive slot: the board boots its old slot,
    unchanged and not switched; the same command resumes its run and commits."""
    b = settled.boards[0]
    old = status(b)
    swu, version = new_swu(settled, "cut-install", size=48 << 20)  # SWUpdate busy long enough to be caught
    with update_running(tmp_path, settled, swu, "--node", b.name, "--health-timeout", "120") as p:

        def writing() -> list[int]:
            assert p.poll() is None, "alma update ended before SWUpdate was seen writing the slot"
            return board_procs(b, "swupdate")

        pids = wait_for("SWUpdate writing the slot", writing, timeout=300)
        for pid in pids:  # type: ignore[attr-defined]
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)  # held mid-write until the power goes
        boots = machine.slots(b.slot_dir)["boots"]
        cut(b)
        rc, doc = finished(p)
    first = board_result(doc, b.name)
    assert first["result"] in ("FAILED", "LOST") and first["phases"][-1]["name"] == "install", first
    b.wait_ready(after_boot=boots)
    st = status(b)
    assert (st["current_slot"], st["version"]) == (old["current_slot"], old["version"]), st
    assert uefi(b)["active"] == SLOT[old["current_slot"]], uefi(b)  # never switched to the torn slot
    r = update(tmp_path, settled, swu, "--node", b.name, "--health-timeout", "120")
    assert r.returncode == 0, r.stdout + r.stderr
    again = board_result(r, b.name)
    assert again["result"] == "COMMITTED" and again["run"] == first["run"], again
    assert_runs(b, other(old["current_slot"]), version)


def test_a_power_cut_while_rebooting_into_the_new_slot_and_the_run_still_commits(settled: Lab, tmp_path: Path) -> None:
    b = settled.boards[1]
    old = status(b)
    boots = machine.slots(b.slot_dir)["boots"]
    swu, version = new_swu(settled, "cut-reboot")
    with update_running(tmp_path, settled, swu, "--node", b.name, "--health-timeout", "120") as p:
        wait_phase(tmp_path, swu, b.name, "reboot", done=True)
        wait_for("the power-on after the reboot", lambda: machine.slots(b.slot_dir)["boots"] > boots, timeout=300)
        cut(b)  # the new slot's first boot, wherever it has got to
        rc, doc = finished(p)
    got = board_result(doc, b.name)
    assert rc == 0 and got["result"] == "COMMITTED", got
    assert_runs(b, other(old["current_slot"]), version)
    assert machine.slots(b.slot_dir)["boots"] >= boots + 2  # the reboot, and the boot after the cut


def test_a_power_cut_while_verifying_with_no_desktop_then_the_same_command_commits(
    settled: Lab, tmp_path: Path
) -> None:
    """The desktop dies after the reboot; the board runs the new slot, verifying (its settle
    unit started the verify deadline); the power goes; it boots the new slot again (one retry
    more), still verifying; the same command judges it on that boot and commits."""
    b = settled.boards[0]
    old = status(b)
    new = other(old["current_slot"])
    swu, version = new_swu(settled, "cut-verify")
    with update_running(tmp_path, settled, swu, "--node", b.name, "--health-timeout", "120") as p:
        wait_phase(tmp_path, swu, b.name, "wait")
        os.killpg(p.pid, signal.SIGKILL)  # the desktop is gone

    def verifying() -> dict[str, Any] | None:
        with contextlib.suppress(Exception):
            st = status(b)
            pend = st["pending"] or {}
            if st["current_slot"] == new and "verifying_since" in pend:
                return st
        return None

    first = wait_for("the board verifying the new slot", verifying, timeout=300)
    b.reboot(power_cut=True)
    st = status(b)
    assert st["current_slot"] == new and st["boot_id"] != first["boot_id"], st  # type: ignore[index]
    assert st["pending"] and st["pending"]["verifying_since"], st
    assert uefi(b)["successful"][SLOT[new]] is False and uefi(b)["slots"][SLOT[new]]["retry_count"] < 3
    r = update(tmp_path, settled, swu, "--node", b.name, "--health-timeout", "120")
    assert r.returncode == 0, r.stdout + r.stderr
    assert board_result(r, b.name)["result"] == "COMMITTED", r.stdout
    assert_runs(b, new, version)


def test_two_desktops_the_second_is_refused_busy_naming_the_holder(settled: Lab, tmp_path: Path) -> None:
    """Two `alma update` processes with their own records (two desktops, one host and user):
    while the first holds the board, the second is refused busy naming the first's run and
    host, and pushes nothing; the first then finishes."""
    b = settled.boards[1]
    old = status(b)
    desk1, desk2 = tmp_path / "desk1", tmp_path / "desk2"
    swu, version = new_swu(settled, "two-desks")
    with update_running(desk1, settled, swu, "--node", b.name, "--health-timeout", "120") as p:
        holder = wait_phase(desk1, swu, b.name, "lock", done=True)
        os.killpg(p.pid, signal.SIGSTOP)  # desktop 1 holds the board while desktop 2 asks
        try:
            r = update(desk2, settled, swu, "--node", b.name)
        finally:
            os.killpg(p.pid, signal.SIGCONT)
        rc, doc = finished(p)
    second = board_result(r, b.name)
    assert r.returncode == 1 and second["result"] == "FAILED", second
    assert f"board busy: update run {holder.run} from {socket.gethostname()}" in second["reason"], second
    assert second["run"] != holder.run and [ph["name"] for ph in second["phases"]] == ["check"], second
    assert rc == 0 and board_result(doc, b.name)["result"] == "COMMITTED", doc
    assert_runs(b, other(old["current_slot"]), version)


# ---- the hawkBit path: the board judges what its SWUpdate daemon installed --------------------


def _hawkbit_install(b: lab.Board, swu: Path) -> dict[str, Any]:
    """What the image's SWUpdate daemon and its hooks do with a download (the daemon itself
    runs in tests/update/test_hawkbit.py; here the board has no hawkBit to poll): ``claim``
    (preupdatecmd), SWUpdate with the daemon's own words writing the inactive slot from its
    copy of the .swu (``-o``: installed from that file), then ``adopt`` (postupdatecmd), which
    switches the slot and reboots the board for real."""
    before = status(b)
    claimed = json.loads(sh(b, "alma-ota", "claim").splitlines()[-1])
    assert claimed["lock"]["run"] == "hawkbit", claimed
    words = sh(b, "alma-ota", "swupdate-args").split()
    at = words.index("-o")
    copy = words[at + 1]
    shutil.copyfile(swu, f"/proc/{b.init_pid()}/root{copy}")
    del words[at : at + 2]  # SWUpdate takes -i or -o, never both
    # the lab's SWUpdate, in a network namespace of its own (docs/lab.md: NotifyServer); its
    # exit code races its child (docs/ota.md): its words, and then adopt's read-back, judge
    out = sh(b, "/usr/local/sbin/swupdate", *words, "-i", copy, timeout=300, check=False)
    assert "SWUPDATE successful" in out, out[-3000:]
    boots = b.boots()
    sh(b, "alma-ota", "adopt", check=False, timeout=120)  # the reboot may end this session
    b.wait_ready(after_boot=boots)
    return before


def _settled_by_the_board(b: lab.Board) -> dict[str, Any]:
    """Starts the settle unit as its timer does (every 5 min) until the board has a verdict."""

    def verdict() -> dict[str, Any] | None:
        with contextlib.suppress(Exception):
            st = status(b)
            if st["pending"] is None and st["lock"] is None:
                return st
            sh(b, "systemctl", "start", "alma-ota-settle.service", check=False, timeout=120)
        return None

    got = wait_for("the board's own verdict", verdict, timeout=300)
    assert isinstance(got, dict)
    return got


def test_a_hawkbit_install_is_judged_healthy_and_committed_by_the_boards_settle_unit(settled: Lab) -> None:
    b = settled.boards[0]
    swu, version = new_swu(settled, "hawkbit")
    old = _hawkbit_install(b, swu)
    new = other(old["current_slot"])
    st = _settled_by_the_board(b)
    assert st["last"]["result"] == "COMMITTED" and "committed by the board" in st["last"]["why"], st
    assert st["boot_id"] != old["boot_id"], st  # judged after a fresh boot
    assert_runs(b, new, version)


def test_a_sick_hawkbit_install_is_rolled_back_by_the_board_and_its_old_slot_stays_good(settled: Lab) -> None:
    b = settled.boards[0]
    swu, _ = new_swu(settled, "hawkbit-sick", health="critical")
    old = _hawkbit_install(b, swu)

    def judged_sick() -> dict[str, Any] | None:
        sh(b, "systemctl", "start", "alma-ota-settle.service", check=False, timeout=120)
        pend = status(b)["pending"] or {}
        return pend if "health CRITICAL" in str(pend.get("verdict")) else None

    wait_for("the board's health verdict on the sick slot", judged_sick, timeout=300)
    # the verifying window (health_s) over, without waiting for it: its stamp moved
    path = Path(f"/proc/{b.init_pid()}/root/data/alma-ota/pending.json")
    path.write_text(json.dumps({**json.loads(path.read_text()), "verifying_since": "2000-01-01T00:00:00Z"}))
    boots = b.boots()
    sh(b, "systemctl", "start", "--no-block", "alma-ota-settle.service")  # rolls back and reboots
    b.wait_ready(after_boot=boots)
    st = _settled_by_the_board(b)
    assert st["last"]["result"] == "ROLLED_BACK" and machine.SICK_LINK in st["last"]["why"], st
    assert_runs(b, old["current_slot"], old["version"])
    sick = SLOT[other(old["current_slot"])]
    assert uefi(b)["slots"][sick]["status"] == "unbootable", uefi(b)
    for _ in range(2):
        b.reboot(power_cut=True)
        assert_runs(b, old["current_slot"], old["version"])
