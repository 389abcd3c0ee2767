"""Flashed -> operated, on real parts.

The flash simulator (tests/flash/sim/initrd-flash) replays initrd-flash and, as the device,
copies flashpkg-extra/ into its flash package and runs the layer's REAL device hook (dash)
against the board's rootfs tree; a fake board on a real pty then boots from that rootfs:
it prints the hostname the hook wrote and the fingerprint of its ssh host key. A REAL sshd
on loopback, holding that host key, stands in for the booted board. `alma flash
--add-to-fleet` writes the fleet entry; `alma fleet health` against it returns the board's
report with strict host-key checking on, and refuses a board whose key is not the pinned one.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support import require_tool
from support_build import ADMIN_PUB
from support_flash import Station
from support_fleet import HEALTH, Sshd
from support_guard import FakeBoard, orin_zones

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent.parent
HOOK = REPO / "layers/meta-alma/dynamic-layers/tegra/recipes-core/initrdscripts/files/alma-board-identity"
USB = "1-3"  # the Orin Nano in tests/flash/devices/apx-7523-orin-nano-8gb.umockdev
ALMA = [sys.executable, "-m", "alma"]


def fingerprint(pub: Path) -> str:
    r = subprocess.run(["ssh-keygen", "-l", "-f", str(pub)], capture_output=True, text=True, check=True)
    return r.stdout.split()[1]


def board_boot(master: int, signal: Path, rootfs: Path, hostkey_pub: Path) -> None:
    """The board after initrd-flash's reboot: boots the rootfs it was flashed with."""
    for _ in range(600):
        if signal.exists():
            break
        time.sleep(0.05)
    else:
        return
    time.sleep(0.2)
    name = (rootfs / "etc/hostname").read_text().strip()  # what the device hook wrote
    fp = fingerprint(hostkey_pub)
    os.write(
        master,
        b"[    0.000000] Linux version 5.15.185-l4t-r36.5-1033.33 (oe-user@oe-host) (aarch64-oe-linux-gcc) #1 SMP\r\n"
        + f"[    2.101001] systemd[1]: Hostname set to <{name}>.\r\n\r\n".encode()
        # what agetty makes of /etc/issue.d/50-alma-board.issue (see tests/layer/test_board_id.py)
        + f"alma-board: name={name} addr={BOARD_ADDR}, hostkey={fp}\r\n\r\n".encode()
        + f"{name} login: ".encode(),
    )


def board_rootfs(root: Path) -> Path:
    (root / "etc").mkdir(parents=True)
    (root / "etc/hostname").write_text("jetson-orin-nano-devkit\n")
    (root / "home/alma/.ssh").mkdir(parents=True)
    (root / "home/alma/.ssh/authorized_keys").write_text(ADMIN_PUB + "\n")
    return root


def health_board(root: Path) -> Path:
    b = FakeBoard(root)
    orin_zones(b, 50.0)
    b.add_iface("eth1", multicast=0, rx_packets=0, carrier=1, speed=10000)
    b.set_meminfo(total_kb=32_000_000, avail_kb=20_000_000)
    b.set_psi(0.0, 0.0)
    b.add_watchdog()
    b.write_guard_state(shedding=False)
    b.write_config("health.toml", "[disk]\nwarn_pct = 0.0\ncrit_pct = 0.0\n")
    return b.root


# The board's address on its console: a documentation address (RFC 5737), which the station
# takes as the board's (a loopback one it refuses: that is the station itself); the test's
# ssh config sends it to the sshd on loopback, so nothing leaves the machine.
BOARD_ADDR = "192.0.2.10"


def test_flashed_board_joins_the_fleet_and_answers_health_with_its_pinned_key(sshd: Sshd, tmp_path: Path) -> None:
    require_tool("dash")
    station = Station(tmp_path / "station")
    bundle = station.bundle()
    station.manifest(bundle)
    device = tmp_path / "device"
    rootfs = board_rootfs(device / USB / "rootfs")
    # The fleet file before: the lab's ssh settings (how the board's address is reached: the
    # test's sshd on loopback) and health command, no node yet. No known_hosts anywhere: the
    # pin must come from the console.
    client = tmp_path / "ssh_config"
    client.write_text(
        f"Host {BOARD_ADDR}\n    HostName 127.0.0.1\n    Port {sshd.port}\n"
        f"    IdentityFile {sshd.dir / 'id_ed25519'}\n    IdentitiesOnly yes\n"
    )
    cache = tmp_path / "cache"
    fleet = tmp_path / "fleet.toml"
    report_root = health_board(tmp_path / "board-state")
    fleet.write_text(
        f'[ssh]\nconfig = "{client}"\nconnect_timeout = 15\n'
        f'[health]\ntimeout = 30\ncommand = "python3 {HEALTH} --root {report_root} --json"\n'
    )

    master, slave = os.openpty()
    signal = tmp_path / "rebooting"
    t = threading.Thread(target=board_boot, args=(master, signal, rootfs, sshd.dir / "host_ed25519.pub"), daemon=True)
    t.start()
    try:
        r = station.alma(
            "flash", "--yes", "--console", os.ttyname(slave), "--boot-timeout", "10",
            "--hostname", "edge-01", "--add-to-fleet", str(fleet), "--ssh-user", getpass.getuser(),
            device="apx-7523-orin-nano-8gb", timeout=120, SIM_BOOT_SIGNAL=str(signal),
            SIM_DEVICE_DIR=str(device), SIM_DEVICE_HOOKS=str(HOOK), SIM_DEVICE_SHELL="dash",
        )  # fmt: skip
    finally:
        t.join(timeout=10)
        os.close(master)
        os.close(slave)
    assert r.returncode == 0, r.stdout + r.stderr
    fp = fingerprint(sshd.dir / "host_ed25519.pub")

    # the device hook wrote the name, the flash record has it and the console line
    assert (rootfs / "etc/hostname").read_text() == "edge-01\n"
    [rec] = station.records_list()
    assert rec["identity"]["hostname"] == "edge-01"  # type: ignore[index]
    assert rec["boot"]["board"] == {"name": "edge-01", "addresses": [BOARD_ADDR], "hostkey": fp}  # type: ignore[index]
    # the entry: printed, and appended to the fleet file
    assert f'host_key = "{fp}"' in r.stdout and 'name = "edge-01"' in r.stdout
    text = fleet.read_text()
    assert text.count("[[node]]") == 1 and f'ssh = "{getpass.getuser()}@{BOARD_ADDR}"' in text
    assert 'role = "board"' in text and f'host_key = "{fp}"' in text

    env = {k: v for k, v in os.environ.items() if not k.startswith("ALMA_")}
    env.update(PYTHONPATH=str(REPO / "src"), XDG_CACHE_HOME=str(cache))
    h = subprocess.run([*ALMA, "fleet", "health", "--fleet", str(fleet), "--json", "--no-save"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)  # fmt: skip
    assert h.returncode == 0, h.stdout + h.stderr
    data = json.loads(h.stdout)
    [node] = data["nodes"]
    assert node["name"] == "edge-01" and node["status"] == "OK", node
    assert {c["name"] for c in node["checks"]} >= {"thermal", "memory", "disk"}
    # pinned, strictly, by ssh itself: no known_hosts file was written anywhere
    assert not list(cache.rglob("*known_hosts*")) if cache.exists() else True
    assert not (Path.home() / ".ssh" / "known_hosts").exists()  # nothing trusted on first use

    # a board answering with another host key (a swapped board, a man in the middle) is refused
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    fleet.write_text(text.replace(fp, fingerprint(Path(f"{other}.pub"))))
    h = subprocess.run([*ALMA, "fleet", "health", "--fleet", str(fleet), "--json", "--no-save"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)  # fmt: skip
    data = json.loads(h.stdout)
    assert h.returncode == 3 and data["nodes"][0]["status"] == "UNKNOWN", h.stdout
    assert "Host key verification failed" in json.dumps(data["nodes"][0])
    assert f"the host offered ssh-ed25519 {fp}" in data["nodes"][0]["summary"]  # expected vs seen
