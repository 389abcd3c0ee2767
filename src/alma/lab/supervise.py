"""A virtual board's power supply: boots its container, again after every reboot or power
cut, until ``alma lab down`` (a ``stop`` file) or a poweroff from inside.

``python -m alma.lab.supervise BOARD_DIR`` (started detached by alma.lab.board). Every
power-on picks the boot slot first (alma.lab.machine.power_on), as the bootloader would, then
boots what that slot holds (alma.lab.machine.boot_plan): an image that does not boot hangs
for ``HANG_S`` and the power-on starts again (the watchdog's reset; the retry is spent).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from alma.lab import machine

NSPAWN_REBOOT = 133  # systemd-nspawn's exit status when the container asked for a reboot
HANG_S = 1.0  # a boot that hangs: this long until the (virtual) watchdog resets the board


def nspawn_argv(board: Path, plan: machine.BootPlan | None = None) -> list[str]:
    m = board / "machine"
    slots = [f"--bind={m / 'disk' / label}:/dev/disk/by-partlabel/{label}" for label in machine.SLOT_LABELS]
    image = [f"--bind-ro={m / 'boot/alma-release'}:/etc/alma-release"] if plan else []
    if plan and plan.critical:
        image.append(f"--bind-ro={m / 'boot/health.toml'}:/etc/alma/health.toml")
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


def main(argv: list[str]) -> int:
    board = Path(argv[0])
    (board / "supervisor.pid").write_text(f"{os.getpid()}\n")
    env = {**os.environ, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1"}
    try:
        while not (board / "stop").exists():
            plan = machine.boot_plan(board / "machine/slot", board / "machine/disk")
            if not plan.boots:
                print(f"slot {'ab'[plan.slot]} does not boot: hangs, the watchdog resets", flush=True)
                time.sleep(HANG_S)
                continue
            health = (board / "root/etc/alma/health.toml").read_text() if plan.critical else ""
            machine.write_boot_files(board / "machine/boot", plan, health)
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
