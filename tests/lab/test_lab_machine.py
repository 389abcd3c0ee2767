"""The virtual board's machine (alma.lab.machine, alma.lab.supervise) in-process: what a
power-on boots from the slot files (and with which slot's identity), and where the board's
cgroup tree goes. The same rules
on running boards: tests/lab/test_board.py and test_update_board.py."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tomllib
from pathlib import Path

import pytest
from support import wait_for

from alma.lab import board as lab
from alma.lab import layout, machine, supervise


def _lab(tmp_path: Path) -> tuple[Path, Path]:
    slot, disk = tmp_path / "slot", tmp_path / "disk"
    machine.new_slots(slot)
    machine.new_disk(disk)
    return slot, disk


def _write(disk: Path, n: int, head: bytes) -> None:
    with open(disk / machine.SLOT_LABELS[n], "r+b") as fh:
        fh.write(head)


def _switch(slot: Path, n: int) -> None:
    """What nvbootctrl set-active-boot-slot N does to the state (N not running)."""
    st = machine.slots(slot)
    st["rootfs"]["active"] = n
    st["rootfs"]["slots"][n] = {"retry_count": machine.RETRIES, "status": "normal"}
    st["rootfs"]["successful"][n] = False
    (slot / "uefi.json").write_text(json.dumps(st))


def test_the_factory_slot_boots_its_version_and_a_blank_slot_never_boots(tmp_path: Path) -> None:
    slot, disk = _lab(tmp_path)
    assert machine.boot_plan(slot, disk) == machine.BootPlan(0, True, machine.FACTORY_VERSION, False)
    _switch(slot, 1)  # B was never written: each power-on spends a retry, then UEFI falls back
    plans = [machine.boot_plan(slot, disk) for _ in range(4)]
    assert [(p.slot, p.boots) for p in plans] == [(1, False)] * 3 + [(0, True)]
    assert machine.slots(slot)["rootfs"]["slots"][1]["status"] == "unbootable"


def test_an_image_that_hangs_spends_its_retries_and_a_sick_one_boots_critical(tmp_path: Path) -> None:
    slot, disk = _lab(tmp_path)
    _write(disk, 1, machine.image_header("1.1.0", boots=False))
    _switch(slot, 1)
    assert [machine.boot_plan(slot, disk).boots for _ in range(4)] == [False, False, False, True]
    _write(disk, 1, machine.image_header("1.2.0", health="critical"))
    _switch(slot, 1)
    assert machine.boot_plan(slot, disk) == machine.BootPlan(1, True, "1.2.0", True)


def test_a_header_whose_version_is_not_a_version_does_not_boot(tmp_path: Path) -> None:
    """The header is what a .swu wrote: its version never reaches /etc/alma-release unchecked."""
    slot, disk = _lab(tmp_path)
    for bad in ('1.0"\nVERSION_ID="9.9', "", "../x", "1" * 80, "2.0.0\n"):
        _write(disk, 1, machine.image_header(bad) + b"\0" * 200)
        _switch(slot, 1)
        assert not machine.boot_plan(slot, disk).boots, bad


def test_the_sick_image_health_config_is_the_image_s_with_one_absent_link_more(tmp_path: Path) -> None:
    shipped = (layout.root() / "tools/guard/conf/health.toml").read_text()
    sick = tomllib.loads(machine.sick_health(shipped))
    want = tomllib.loads(shipped)
    want["links"]["expected"][machine.SICK_LINK] = 1000
    assert sick == want
    plan = machine.BootPlan(1, True, "1.2.0", True)
    machine.write_boot_files(tmp_path / "boot", plan, shipped)
    assert (tmp_path / "boot/alma-release").read_text() == 'ID=alma\nVERSION_ID="1.2.0"\n'
    argv = supervise.nspawn_argv(tmp_path, plan)
    assert f"--bind-ro={tmp_path / 'machine/boot/health.toml'}:/etc/alma/health.toml" in argv
    assert not any("health.toml" in a for a in supervise.nspawn_argv(tmp_path, plan.__class__(1, True, "1", False)))


def test_the_cgroup_v2_mount_is_found_on_hybrid_and_unified_hosts() -> None:
    hybrid = (
        "35 25 0:30 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
        "36 35 0:31 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
        "37 35 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    )
    unified = "30 25 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
    assert supervise.cgroup_mount(hybrid) == Path("/sys/fs/cgroup/unified")
    assert supervise.cgroup_mount(unified) == Path("/sys/fs/cgroup")
    assert supervise.cgroup_mount("37 35 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n") is None


def test_the_cpu_controller_s_v1_hierarchy_is_found_by_its_option_not_its_name() -> None:
    mountinfo = (
        "36 35 0:31 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
        "37 35 0:32 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n"
        "38 35 0:33 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
    )
    assert supervise.cgroup_mount(mountinfo, "cpu") == Path("/sys/fs/cgroup/cpu,cpuacct")
    assert supervise.cgroup_mount(mountinfo, "cpuacct") == Path("/sys/fs/cgroup/cpu,cpuacct")
    assert supervise.cgroup_mount(mountinfo, "memory") is None  # "cpuset" is not "cpu" either


def test_a_board_whose_cpu_budget_cannot_be_enforced_is_not_booted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`alma lab up --cpus` on a host with no cpu controller to hold the board to it: the
    supervisor says so and exits before booting anything (a board pretending to have a budget
    would make every figure measured on it wrong)."""
    board = tmp_path / "vb1"
    board.mkdir()
    (board / supervise.CPUS_FILE).write_text("0.5\n")
    monkeypatch.setattr(supervise, "own_cgroup", lambda b: None)
    monkeypatch.setattr(supervise, "cgroup_mount", lambda mountinfo, controller=None: None)
    booted: list[object] = []
    monkeypatch.setattr(supervise.subprocess, "Popen", lambda *a, **k: booted.append(a))
    assert supervise.main([str(board)]) == 1
    assert booted == []
    assert not (board / "supervisor.pid").exists()


def test_each_slot_boots_its_own_identity_and_a_rewritten_slot_the_image_s(tmp_path: Path) -> None:
    """On a board /etc is the slot's: the lab keeps each slot's identity files and puts the
    booted one's in place at power-on; a slot SWUpdate wrote boots the image's, a new host key."""
    slot, disk = _lab(tmp_path)
    root, ident = tmp_path / "root", tmp_path / "identity"
    (root / "etc/ssh").mkdir(parents=True)
    (root / "etc/hostname").write_text("jetson-agx-orin-devkit\n")
    machine.save_identity(root, ident / machine.IMAGE)  # the image as installed: no host key
    (root / "etc/hostname").write_text("edge-7\n")  # the flash hook's
    (root / machine.HOST_KEY).write_text("flashed key\n")
    machine.flashed_identity(ident, root, disk)
    assert machine.switch_identity(ident, root, disk, 0) == "slot a: unchanged"
    _write(disk, 1, machine.image_header("2.0.0"))  # SWUpdate writes slot B
    assert "rewritten" in machine.switch_identity(ident, root, disk, 1)
    assert (root / "etc/hostname").read_text() == "jetson-agx-orin-devkit\n"
    assert (root / machine.HOST_KEY).read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    b_key = (root / machine.HOST_KEY).read_text()
    (root / "etc/hostname").write_text("b-was-renamed\n")  # what B's boot wrote stays B's
    assert machine.switch_identity(ident, root, disk, 0) == "slot a: its own identity"
    assert (root / "etc/hostname").read_text() == "edge-7\n"
    assert (root / machine.HOST_KEY).read_text() == "flashed key\n"
    assert machine.switch_identity(ident, root, disk, 1) == "slot b: its own identity"  # not rewritten since
    assert (root / "etc/hostname").read_text() == "b-was-renamed\n"
    assert (root / machine.HOST_KEY).read_text() == b_key


def test_a_boards_ssh_port_is_never_one_an_outgoing_connection_can_take() -> None:
    """The board binds its port only when it boots. A port from the ephemeral range can become
    the local port of any outgoing connection meanwhile (seen: sshd.socket failed with
    EADDRINUSE, the board never reachable); the lab picks ports the kernel never hands out."""
    lo, hi = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = {lab._free_port() for _ in range(50)}
    assert all(not lo <= p <= hi for p in ports), sorted(p for p in ports if lo <= p <= hi)
    assert len(ports) > 1  # random: parallel labs do not try the same ports in turn
    for p in ports:  # and free to bind
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def _flashed_then_slot_b(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A board flashed as edge-7 (with an admin key), then booted into a rewritten slot B."""
    _, disk = _lab(tmp_path)
    root, ident = tmp_path / "root", tmp_path / "identity"
    (root / "etc/ssh").mkdir(parents=True)
    (root / "home/alma/.ssh").mkdir(parents=True)
    (root / "etc/hostname").write_text("edge-7\n")
    (root / "home/alma/.ssh/authorized_keys").write_text("flashed admin key\n")
    machine.save_identity(root, ident / machine.IMAGE)
    machine.flashed_identity(ident, root, disk)
    _write(disk, 1, machine.image_header("2.0.0"))
    machine.switch_identity(ident, root, disk, 1)  # B booted: its own identity from here
    return root, ident, disk


def test_a_link_in_the_boards_root_never_leads_the_identity_switch_to_the_hosts_files(tmp_path: Path) -> None:
    """The board writes its own root (its admin owns /home/alma): a directory there made an
    absolute symlink must not make the host-side switch read, unlink or write the host's files."""
    root, ident, disk = _flashed_then_slot_b(tmp_path)
    host = tmp_path / "host"
    host.mkdir()
    (host / "authorized_keys").write_text("the host's own\n")
    shutil.rmtree(root / "home/alma/.ssh")
    (root / "home/alma/.ssh").symlink_to(host)  # what the board's admin may do in B
    machine.switch_identity(ident, root, disk, 0)  # saves B's, restores A's
    assert (host / "authorized_keys").read_text() == "the host's own\n"
    assert not (ident / "APP_b/home/alma/.ssh/authorized_keys").exists()  # nothing of the host's copied
    assert (root / "etc/hostname").read_text() == "edge-7\n"  # the rest restored all the same


def test_a_directory_the_board_removed_never_stops_its_power_on(tmp_path: Path) -> None:
    """The admin removed ~/.ssh in slot B: the switch back to A must not crash the supervisor
    (a board that can never boot again) but leave that file as the board made it."""
    root, ident, disk = _flashed_then_slot_b(tmp_path)
    shutil.rmtree(root / "home/alma/.ssh")
    machine.switch_identity(ident, root, disk, 0)
    assert (root / "etc/hostname").read_text() == "edge-7\n"
    assert not (root / "home/alma/.ssh").exists()


def test_a_free_port_is_found_when_few_lie_outside_the_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lab, "_ephemeral_ports", lambda: range(1024, 65500))
    assert 65500 <= lab._free_port() <= 65535


def test_a_sick_images_health_config_is_the_images_never_one_read_through_the_boards_root(tmp_path: Path) -> None:
    """The board writes its own root: its /etc/alma a link to a host directory must not have
    the supervisor read a host file into the board's bound health.toml."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "health.toml").write_text('[secret]\ntoken = "the host\'s"\n')
    (tmp_path / "root/etc").mkdir(parents=True)
    (tmp_path / "root/etc/alma").symlink_to(host)
    supervise.boot_files(tmp_path, machine.BootPlan(1, True, "1.2.0", True))
    shipped = (layout.root() / "tools/guard/conf/health.toml").read_text()
    assert (tmp_path / "machine/boot/health.toml").read_text() == machine.sick_health(shipped)


# The commands alma-ota runs, in an order that visits every state change (switch, fall back,
# mark good, capsule verify), and a few it must refuse.
NVBOOTCTRL_STEPS = [
    ["-t", "rootfs", "get-current-slot"],
    ["-t", "rootfs", "dump-slots-info"],
    ["-t", "rootfs", "get-number-slots"],
    ["dump-slots-info"],
    ["-t", "rootfs", "set-active-boot-slot", "1"],
    ["-t", "rootfs", "dump-slots-info"],
    ["-t", "rootfs", "set-slot-as-unbootable", "1"],
    ["-t", "rootfs", "set-active-boot-slot", "0"],
    ["-t", "rootfs", "mark-boot-successful"],
    ["-t", "bootloader", "verify"],
    ["-t", "bootloader", "get-current-slot"],
    ["-t", "rootfs", "no-such-command"],
    [],
]


def test_the_board_s_nvbootctrl_answers_and_writes_as_the_simulated_board_s(tmp_path: Path) -> None:
    """The lab's stand-in reads uefi.json without the json module (a cheap start, as the real
    native tool's): every command answers, exits and leaves the state exactly as the
    simulated board's nvbootctrl (tests/support_update.py) does, starting from the state the
    supervisor writes and from one after a power-on; the supervisor reads what it wrote."""
    import os
    import subprocess
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import support_update

    for powered in (False, True):
        slot = tmp_path / f"slot{powered}"
        machine.new_slots(slot)
        if powered:
            machine.power_on(slot)
        sim_root = tmp_path / f"sim{powered}"
        (sim_root / "sim").mkdir(parents=True)
        (sim_root / "sim/uefi.json").write_text((slot / "uefi.json").read_text())
        tool = tmp_path / f"nvbootctrl{powered}"
        tool.write_text(machine.NVBOOTCTRL.replace("/var/lib/alma-lab/uefi.json", str(slot / "uefi.json")))
        os.chmod(tool, 0o755)
        for argv in NVBOOTCTRL_STEPS:
            got = subprocess.run([str(tool), *argv], capture_output=True, text=True, timeout=60)
            want_out = subprocess.run(
                [sys.executable, "-c", "import sys, support_update as s; from pathlib import Path; "
                 "sys.exit(s.nvbootctrl(Path(sys.argv[1]), sys.argv[2:]))", str(sim_root), *argv],
                capture_output=True, text=True, timeout=60, cwd=Path(support_update.__file__).parent,
            )  # fmt: skip
            assert (got.returncode, got.stdout) == (want_out.returncode, want_out.stdout), argv
            assert machine.slots(slot) == support_update.load_state(sim_root), argv
        assert machine.power_on(slot) in (0, 1)  # the supervisor reads what the stand-in wrote


def test_the_board_s_nvbootctrl_refuses_a_state_it_cannot_read(tmp_path: Path) -> None:
    import os
    import subprocess

    slot = tmp_path / "slot"
    machine.new_slots(slot)
    tool = tmp_path / "nvbootctrl"
    tool.write_text(machine.NVBOOTCTRL.replace("/var/lib/alma-lab/uefi.json", str(slot / "uefi.json")))
    os.chmod(tool, 0o755)
    good = (slot / "uefi.json").read_text()
    for bad in (good[:-5], good.replace('"normal"', '"nor\\"mal"', 1), good + "x", good.replace("3", "3.5", 1)):
        (slot / "uefi.json").write_text(bad)
        r = subprocess.run([str(tool), "-t", "rootfs", "mark-boot-successful"], capture_output=True, text=True,
                           timeout=60)  # fmt: skip
        assert r.returncode != 0 and "ValueError" in r.stderr
        assert (slot / "uefi.json").read_text() == bad  # nothing written


def test_the_board_s_init_is_pid_1_of_its_namespace_not_nspawn_s_first_child(tmp_path: Path) -> None:
    """While a container starts, nspawn's first child is its outer child, in the host's pid
    namespace; a power cut aimed at it missed the board (seen under load: the board booted on
    and the cut never happened). Here a stand-in for nspawn whose first child is a shell in the
    host's namespace, whose child makes a new pid namespace: init_pid names that one's PID 1."""
    if os.geteuid() != 0:
        pytest.skip("a new pid namespace needs root")
    import subprocess

    tree = subprocess.Popen(["sh", "-c", "unshare --pid --fork --kill-child sleep 120; :"])
    try:
        board = lab.Board(tmp_path, "vb1")
        board.dir.mkdir()
        (board.dir / "nspawn.pid").write_text(f"{os.getpid()}\n")  # this test process stands in for nspawn
        def sleep_is_init() -> int | None:  # PID 1 is unshare's child: "unshare" until it execs sleep
            pid = board.init_pid()
            with contextlib.suppress(OSError):
                if pid is not None and Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == b"sleep":
                    return pid
            return None

        init = wait_for(sleep_is_init, what="PID 1 of the new namespace, running sleep")
        assert init != tree.pid  # the shell in between, the first child, is not it
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(tree.pid)], check=False)  # unshare: its child goes with it
        tree.kill()
        tree.wait()


@pytest.mark.parametrize("text", ["nan", "-1", "0", "lots"])
def test_a_cpu_budget_that_is_not_a_number_of_cores_is_refused(
    text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    board = tmp_path / "vb1"
    board.mkdir()
    (board / supervise.CPUS_FILE).write_text(f"{text}\n")
    with pytest.raises(OSError, match="not a number of cores"):
        supervise.cpu_budget(board, None)
