"""A virtual board's power supply: boots its container, again after every reboot or power
cut, until ``alma lab down`` (a ``stop`` file) or a poweroff from inside.

``python -m alma.lab.supervise BOARD_DIR`` (started detached by alma.lab.board). Every
power-on picks the boot slot first (alma.lab.machine.power_on), as the bootloader would, then
boots what that slot holds (alma.lab.machine.boot_plan): an image that does not boot hangs
for ``HANG_S`` and the power-on starts again (the watchdog's reset; the retry is spent).
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from alma.lab import layout, machine

HEALTH_TOML = "/etc/alma/health.toml"
CGROUP_FILE = "cgroup"  # the board's own cgroup (v2), removed by `alma lab down`
CPUS_FILE = "cpus"  # the board's CPU budget in cores (`alma lab up --cpus`); absent: the host's, shared
CPU_CGROUP_FILE = "cpu-cgroup"  # where that budget is enforced when not in CGROUP_FILE's (cgroup v1)
CPU_PERIOD_US = 100_000
NSPAWN_REBOOT = 133  # systemd-nspawn's exit status when the container asked for a reboot
HANG_S = 1.0  # a boot that hangs: this long until the (virtual) watchdog resets the board


def nspawn_argv(board: Path, plan: machine.BootPlan | None = None) -> list[str]:
    m = board / "machine"
    slots = [f"--bind={m / 'disk' / label}:/dev/disk/by-partlabel/{label}" for label in machine.SLOT_LABELS]
    image = [f"--bind-ro={m / 'boot/alma-release'}:/etc/alma-release"] if plan else []
    if plan and plan.critical:
        image.append(f"--bind-ro={m / 'boot/health.toml'}:{HEALTH_TOML}")
    return [
        "systemd-nspawn",
        "--quiet",
        "--directory", str(board / "root"),
        "--machine", board.name,
        "--register=no",
        "--keep-unit",
        "--boot",
        f"--bind={board / 'machine/thermal'}:/sys/class/thermal",
        f"--bind={board / 'machine/slot'}:/var/lib/alma-lab",
        # The kernel log, read-only: alma-health's GPU-fault check reads it as on a board
        "--bind-ro=/dev/kmsg",
        "--capability=CAP_SYSLOG",  # nspawn drops it; alma-health.service holds it on a board
        *slots,  # the rootfs slots SWUpdate writes, as the image's partition labels
        *image,  # what the booted slot's image is (its version, a sick image's health config)
    ]  # fmt: skip


def cgroup_mount(mountinfo: str, controller: str | None = None) -> Path | None:
    """Where a cgroup hierarchy is mounted, from /proc/self/mountinfo: v2's (``/sys/fs/cgroup``,
    or ``/sys/fs/cgroup/unified`` on a hybrid host) when ``controller`` is None, else the v1
    hierarchy holding ``controller`` (``/sys/fs/cgroup/cpu,cpuacct``, say)."""
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields = right.split()
        if controller is None and fields[:1] == ["cgroup2"]:
            return Path(left.split()[4])
        if controller is not None and len(fields) >= 3 and fields[0] == "cgroup" and controller in fields[2].split(","):
            return Path(left.split()[4])
    return None


def my_cgroup(controller: str | None = None) -> str:
    """This process's cgroup in the hierarchy ``cgroup_mount`` names (from /proc/self/cgroup)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (controllers == "") if controller is None else (controller in controllers.split(",")):
            return path
    return "/"


def own_cgroup(board: Path) -> Path | None:
    """Move this supervisor into a cgroup of the board's own, below its current one. nspawn
    (``--keep-unit``, no machined) puts the container in ``payload/`` below the caller's cgroup,
    so boards started from one cgroup would all share one tree: each board's systemd would see
    the others' processes in "its" units (a stop waits out its timeout for them, a freeze of
    alma-work.slice would reach every board). Returns the cgroup, or None without cgroup v2."""
    mount = cgroup_mount(Path("/proc/self/mountinfo").read_text())
    if mount is None:
        return None
    cg = mount / my_cgroup().lstrip("/") / f"alma-lab-{board.name}"
    cg.mkdir(exist_ok=True)
    (board / CGROUP_FILE).write_text(f"{cg}\n")
    (cg / "cgroup.procs").write_text(f"{os.getpid()}\n")
    return cg


def cpu_budget(board: Path, own: Path | None) -> Path | None:
    """Hold the board to its CPU budget (CPUS_FILE), as a real board is held to its own cores:
    CFS bandwidth on the board's cgroup, v2's ``cpu.max`` where the cpu controller can be
    enabled for it, else (a hybrid host, whose unified tree has no controllers) a cgroup of the
    board's own in v1's cpu hierarchy. Returns where, None without a budget; OSError when it
    cannot be enforced (the board must not boot pretending it is)."""
    try:
        text = (board / CPUS_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    try:
        cpus = float(text)
    except ValueError:
        cpus = math.nan
    if not math.isfinite(cpus) or cpus <= 0:
        raise OSError(f"{board / CPUS_FILE}: {text[:40]!r} is not a number of cores")
    quota = f"{max(1000, round(cpus * CPU_PERIOD_US))}"
    if own is not None:
        with contextlib.suppress(OSError):  # refused when the parent holds processes of its own
            (own.parent / "cgroup.subtree_control").write_text("+cpu\n")
        if (own / "cpu.max").exists():
            (own / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}\n")
            return own
    mount = cgroup_mount(Path("/proc/self/mountinfo").read_text(), "cpu")
    if mount is None:
        raise OSError("no cpu controller for the board: cgroup v2's cpu.max cannot be enabled, no v1 cpu hierarchy")
    cg = mount / my_cgroup("cpu").lstrip("/") / f"alma-lab-{board.name}"
    cg.mkdir(exist_ok=True)
    (board / CPU_CGROUP_FILE).write_text(f"{cg}\n")
    (cg / "cpu.cfs_period_us").write_text(f"{CPU_PERIOD_US}\n")
    (cg / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (cg / "cgroup.procs").write_text(f"{os.getpid()}\n")
    return cg


def remove_cgroup(board: Path) -> bool:
    """Remove the board's cgroup trees (deepest first); True when none is left."""
    left = False
    for file in (CGROUP_FILE, CPU_CGROUP_FILE):
        try:
            cg = Path((board / file).read_text().strip())
        except OSError:
            continue
        if cg.name != f"alma-lab-{board.name}" or not cg.is_dir():
            continue  # not one we made, or gone
        for d in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            cg.rmdir()
        left = left or cg.exists()
    return not left


def boot_files(board: Path, plan: machine.BootPlan) -> None:
    """The booted image's own files (machine.write_boot_files). A sick image's health config
    is the image's (the layout's source), never read through the board's root: the board
    writes that (a link there would have this root process read a host file into the board),
    and a rewritten slot does not carry the old slot's edits."""
    health = ""
    if plan.critical:
        [src] = [f.src for f in layout.load().files if f.dest == HEALTH_TOML]
        health = (layout.root() / src).read_text()
    machine.write_boot_files(board / "machine" / "boot", plan, health)


def main(argv: list[str]) -> int:
    board = Path(argv[0])
    (board / "supervisor.pid").write_text(f"{os.getpid()}\n")
    own = None
    try:
        own = own_cgroup(board)
    except OSError as exc:  # booted all the same, sharing its caller's cgroup tree (docs/lab.md)
        print(f"no cgroup of the board's own: {exc}", flush=True)
    env = {**os.environ, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}
    try:
        try:
            cpu_budget(board, own)
        except OSError as exc:
            print(f"cannot hold the board to its CPU budget, not booting it: {exc}", flush=True)
            return 1
        while not (board / "stop").exists():
            plan = machine.boot_plan(board / "machine/slot", board / "machine/disk")
            if not plan.boots:
                print(f"slot {'ab'[plan.slot]} does not boot: hangs, the watchdog resets", flush=True)
                time.sleep(HANG_S)
                continue
            # the booted slot's /etc: its own identity, or the image's if the slot was rewritten
            m = board / "machine"
            print(machine.switch_identity(m / "identity", board / "root", m / "disk", plan.slot), flush=True)
            boot_files(board, plan)
            (board / "powered-on").write_text(f"{time.monotonic()}\n")  # boot-to-ready counts from here
            with open(board / "console.log", "ab") as console:
                proc = subprocess.Popen(
                    nspawn_argv(board, plan), stdin=subprocess.DEVNULL, stdout=console, stderr=console, env=env
                )
                (board / "nspawn.pid").write_text(f"{proc.pid}\n")
                rc = proc.wait()
            (board / "nspawn.pid").unlink(missing_ok=True)
            print(f"container exited with {rc}", flush=True)
            if rc == 0:  # powered off from inside: the board stays off
                break
            # 133: reboot; anything else: a power cut (PID 1 killed) or a crash: power on again
    finally:
        (board / "supervisor.pid").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
