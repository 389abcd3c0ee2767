"""A fake board tree for tools/guard (alma-guard, alma-health, alma-fabric) and its users.

``FakeBoard(root)`` builds the files those tools read under ``root``, laid out exactly as
on a board, so ``alma-health --root ROOT`` / ``alma-guard --root ROOT`` read it instead of
the machine (docs/guard.md, "Fake trees"). The fleet tests (an sshd running the real
alma-health) and bench/ use it too::

    from support_guard import FakeBoard, orin_zones
    board = FakeBoard(tmp_path / "node1")
    orin_zones(board, 55.0)                      # Orin's nine zones with their R36 trips
    board.add_iface("eth1", multicast=0, rx_packets=0, carrier=1, speed=10000)
    board.set_meminfo(total_kb=32_000_000, avail_kb=20_000_000)
    board.add_kmsg("nvgpu: 17000000.gpu gk20a_fifo_handle_pbdma_intr:1234 [ERR]  pbdma fault")
    board.write_guard_state(shedding=False)      # a fresh guard state file

Values are written in place with a fixed width (as sysfs regenerates its attributes),
so a running guard that keeps its descriptors open sees every change.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from support import DEADLINE_S

if TYPE_CHECKING:
    from collections.abc import Callable

    from almaguard.guard import Guard

REPO = Path(__file__).resolve().parent.parent
GUARD_DIR = REPO / "tools" / "guard"
ALMA_GUARD = GUARD_DIR / "alma-guard"
ALMA_HEALTH = GUARD_DIR / "alma-health"
ALMA_FABRIC = GUARD_DIR / "alma-fabric"
UNITS_DIR = GUARD_DIR / "systemd"

BOARD_DIR = REPO / "tools" / "board"
for _d in (BOARD_DIR, GUARD_DIR):  # the on-board packages, as the scripts load them
    if str(_d) not in sys.path:
        sys.path.insert(0, str(_d))

ORIN_ZONES = ("cpu-thermal", "gpu-thermal", "cv0-thermal", "cv1-thermal", "cv2-thermal",
              "soc0-thermal", "soc1-thermal", "soc2-thermal", "tj-thermal")  # fmt: skip
# Orin R36 trips per zone: 99 C passive (clock throttles), 104.5 C critical (shutdown),
# 70 C passive bound only to hot-surface-alert.
ORIN_TRIPS = (("passive", 99.0), ("critical", 104.5), ("passive", 70.0))

# Process states in /proc/PID/stat: what a paused worker shows, and what a running one may.
STOPPED = {"T"}
RUNNING = {"R", "S", "D"}


class Clock:
    """The time a test moves: ``t`` is the guard's monotonic ``now`` (Guard.step) and, for a
    guard made with ``boot_clock=clock.boottime``, its CLOCK_BOOTTIME too, so a test that
    judges the state's freshness gives alma-health the same ``boottime=clock.t`` and mixes
    in no real clock (whose value is the host's uptime). It starts at a board up a minute."""

    START = 60.0

    def __init__(self) -> None:
        self.t = self.START

    def wall(self) -> float:
        return 1_780_000_000.0 + self.t

    def boottime(self) -> float:
        return self.t


def polls(guard: Guard, clock: Clock, seconds: float) -> list[str]:
    """Step ``guard`` once per second of ``clock`` for ``seconds``; the actions it took."""
    out = []
    end = clock.t + seconds
    while clock.t < end:
        clock.t += 1.0
        a = guard.step(clock.t)
        if a:
            out.append(a)
    return out


def make_guard(
    board: FakeBoard, clock: Clock, *, boot_clock: Callable[[], float] | None = None, **cfg: object
) -> Guard:
    """A guard on ``board``'s tree; ``cfg`` overrides the test defaults (30 s hold-off);
    ``boot_clock`` replaces the real CLOCK_BOOTTIME its state is stamped with."""
    from almaboard.files import boottime
    from almaboard.paths import Paths
    from almaguard.config import GuardConfig
    from almaguard.guard import Guard

    base: dict[str, object] = {"holdoff_s": 30.0, "hysteresis_c": 10.0, "margin_c": 10.0, "state_every_s": 5.0}
    base.update(cfg)
    return Guard(
        GuardConfig(**base),  # type: ignore[arg-type]
        Paths(board.root),
        wall=clock.wall,
        boottime_clock=boot_clock or boottime,
    )


def _put(path: Path, text: str) -> None:
    """Write in place (same inode), padded so a reader never sees a shorter, torn value."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode()
    if path.exists() and path.is_file():
        old = path.stat().st_size
        if len(data) < old:
            data = data.rstrip(b"\n").rjust(old - 1) + b"\n"
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
    else:
        path.write_bytes(data)


class FakeBoard:
    def __init__(self, root: Path, boot_id: str = "0b0e5a0c-0000-4000-8000-000000000001") -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._zones: dict[str, Path] = {}
        self._types: dict[str, str] = {}  # key -> the zone's type (a zone comes back as itself)
        self._kmsg_seq = 0
        self.set_boot_id(boot_id)
        self.set_hostname("alma-orin-1")
        (self.root / "dev").mkdir(exist_ok=True)
        (self.root / "sys/class/net").mkdir(parents=True, exist_ok=True)
        (self.root / "sys/class/watchdog").mkdir(parents=True, exist_ok=True)
        (self.root / "sys/class/thermal").mkdir(parents=True, exist_ok=True)
        (self.root / "dev/kmsg").touch()

    def p(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    # -- identity ----------------------------------------------------------------------
    def set_boot_id(self, boot_id: str) -> None:
        self.boot_id = boot_id
        _put(self.p("/proc/sys/kernel/random/boot_id"), boot_id + "\n")

    def set_hostname(self, name: str) -> None:
        _put(self.p("/etc/hostname"), name + "\n")

    # -- thermal -----------------------------------------------------------------------
    def add_zone(
        self, kind: str, temp_c: float, trips: tuple[tuple[str, float], ...] = ORIN_TRIPS, key: str | None = None
    ) -> Path:
        """A thermal_zoneN of type ``kind``; ``key`` names it for the setters when types repeat."""
        d = self.p(f"/sys/class/thermal/thermal_zone{len(self._zones)}")
        d.mkdir(parents=True, exist_ok=True)
        _put(d / "type", kind + "\n")
        for i, (tkind, ttemp) in enumerate(trips):
            _put(d / f"trip_point_{i}_type", tkind + "\n")
            _put(d / f"trip_point_{i}_temp", f"{int(round(ttemp * 1000))}\n")
        self._zones[key or kind] = d
        self._types[key or kind] = kind
        self.set_temp(key or kind, temp_c)
        return d

    def set_temp(self, kind: str, temp_c: float) -> None:
        _put(self._zones[kind] / "temp", f"{int(round(temp_c * 1000)):>7}\n")

    def set_all_temps(self, temp_c: float) -> None:
        for kind in self._zones:
            self.set_temp(kind, temp_c)

    def break_sensor(self, kind: str) -> None:
        """The sensor returns garbage instead of a number (how a failing read looks here)."""
        _put(self._zones[kind] / "temp", "EIO\n")

    # -- network -----------------------------------------------------------------------
    def add_iface(
        self,
        name: str,
        multicast: int = 0,
        rx_packets: int = 0,
        carrier: int | None = 1,
        speed: int | None = 1000,
        operstate: str = "up",
    ) -> None:
        d = self.p(f"/sys/class/net/{name}")
        (d / "statistics").mkdir(parents=True, exist_ok=True)
        self.set_counters(name, multicast, rx_packets)
        _put(d / "operstate", operstate + "\n")
        if carrier is None:  # reading carrier of a down interface fails (EINVAL): no file here
            (d / "carrier").unlink(missing_ok=True)
        else:
            _put(d / "carrier", f"{carrier}\n")
        _put(d / "speed", f"{-1 if speed is None else speed}\n")

    def set_counters(self, name: str, multicast: int, rx_packets: int) -> None:
        st = self.p(f"/sys/class/net/{name}/statistics")
        _put(st / "multicast", f"{multicast}\n")
        _put(st / "rx_packets", f"{rx_packets}\n")

    # -- memory ------------------------------------------------------------------------
    def set_meminfo(self, total_kb: int, avail_kb: int) -> None:
        _put(
            self.p("/proc/meminfo"),
            f"MemTotal:       {total_kb} kB\nMemFree:        {avail_kb // 2} kB\nMemAvailable:   {avail_kb} kB\n",
        )

    def set_psi(self, some_avg10: float, full_avg10: float) -> None:
        _put(
            self.p("/proc/pressure/memory"),
            f"some avg10={some_avg10:.2f} avg60=0.00 avg300=0.00 total=1\n"
            f"full avg10={full_avg10:.2f} avg60=0.00 avg300=0.00 total=1\n",
        )

    # -- kernel log ----------------------------------------------------------------------
    def add_kmsg(self, text: str, prio: int = 3) -> int:
        """Append one /dev/kmsg record (``prio,seq,usec,-;text``); returns its sequence number."""
        self._kmsg_seq += 1
        with self.p("/dev/kmsg").open("a") as fh:
            fh.write(f"{prio},{self._kmsg_seq},{self._kmsg_seq * 1000},-;{text}\n")
            fh.write(" SUBSYSTEM=platform\n")  # a dictionary line, as the kernel adds
        return self._kmsg_seq

    # -- watchdog, PMC, power supplies ----------------------------------------------------
    def add_watchdog(
        self, identity: str = "Tegra WDT", timeout: int = 120, state: str = "active", bootstatus: int = 0
    ) -> None:
        d = self.p("/sys/class/watchdog/watchdog0")
        _put(d / "identity", identity + "\n")
        _put(d / "timeout", f"{timeout}\n")
        _put(d / "state", state + "\n")
        _put(d / "bootstatus", f"{bootstatus}\n")

    def set_pmc(self, reason: str, level: str = "L0") -> None:
        """Orin's PMC as upstream drivers/soc/tegra/pmc.c exposes it (device under bus@0)."""
        d = self.p("/sys/devices/platform/bus@0/c360000.pmc")
        _put(d / "reset_reason", reason + "\n")
        _put(d / "reset_level", level + "\n")

    def add_power_supply(self, name: str, kind: str, online: int | None = None, status: str | None = None) -> None:
        d = self.p(f"/sys/class/power_supply/{name}")
        _put(d / "type", kind + "\n")
        if online is not None:
            _put(d / "online", f"{online}\n")
        if status is not None:
            _put(d / "status", status + "\n")

    # -- cgroup (the SIGSTOP path: a fake cgroup has no cgroup.freeze) ----------------------
    def set_slice_pids(self, pids: list[int], slice_dir: str = "alma.slice/alma-work.slice") -> Path:
        d = self.p(f"/sys/fs/cgroup/{slice_dir}")
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
        return d

    # -- guard state and config ----------------------------------------------------------
    def write_guard_state(
        self,
        shedding: bool = False,
        age_s: float = 0.0,
        reason: str = "normal",
        unreadable: list[str] | None = None,
        zones: dict[str, float] | None = None,
    ) -> Path:
        now = time.time() - age_s
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        state = {
            "schema": "alma.guard-state/1",
            "updated": stamp,
            "shedding": shedding,
            "since": stamp,
            "reason": reason,
            "zones": zones if zones is not None else {"tj-thermal": 61.5},
            "unreadable": unreadable or [],
        }
        path = self.p("/run/alma-guard/state.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(state))
        return path

    def write_config(self, name: str, text: str) -> Path:
        path = self.p(f"/etc/alma/{name}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path


def orin_zones(board: FakeBoard, temp_c: float = 50.0) -> None:
    for kind in ORIN_ZONES:
        board.add_zone(kind, temp_c)


def proc_state(pid: int) -> str:
    """The state letter of a real process from /proc/PID/stat (T = stopped)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text.rsplit(")", 1)[1].split()[0]


def wait_state(pid: int, want: set[str], timeout: float = DEADLINE_S) -> str:
    deadline = time.monotonic() + timeout
    st = proc_state(pid)
    while st not in want and time.monotonic() < deadline:
        time.sleep(0.005)
        st = proc_state(pid)
    return st


def spawn_worker(procs: list[subprocess.Popen[bytes]], counter: Path | None = None) -> subprocess.Popen[bytes]:
    """A busy-ish worker that appends to ``counter`` every 10 ms (progress is observable)."""
    code = (
        "import sys, time\n"
        "path = sys.argv[1] if len(sys.argv) > 1 else None\n"
        "while True:\n"
        "    if path:\n"
        "        open(path, 'a').write('x')\n"
        "    time.sleep(0.01)\n"
    )
    args = [sys.executable, "-c", code] + ([str(counter)] if counter else [])
    p = subprocess.Popen(args)
    procs.append(p)
    return p


class ReadOnly:
    """Make ``path`` a read-only bind mount of itself (a read-only /run, as the issue found it)
    and back. Real EROFS for root too, unlike chmod 0555 (root ignores mode bits)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.mounted = False

    @staticmethod
    def available() -> str:
        """'' when bind mounts work here, else why not."""
        if os.geteuid() != 0:
            return "read-only bind mounts need root"
        if not shutil.which("mount"):
            return "no mount(8)"
        return ""

    def on(self) -> None:
        if self.mounted:
            return
        subprocess.run(["mount", "--bind", str(self.path), str(self.path)], check=True, capture_output=True)
        self.mounted = True
        subprocess.run(
            ["mount", "-o", "remount,bind,ro", str(self.path)], check=True, capture_output=True
        )

    def off(self) -> None:
        if self.mounted:
            subprocess.run(["umount", str(self.path)], check=True, capture_output=True)
            self.mounted = False

    def __enter__(self) -> ReadOnly:
        self.on()
        return self

    def __exit__(self, *exc: object) -> None:
        self.off()


def remove_zone(board: FakeBoard, kind: str, whole_dir: bool = False) -> None:
    """The zone's ``temp`` (or its whole thermal_zoneN directory) disappears.

    As on sysfs, where a descriptor kept on a removed attribute fails to read (kernfs:
    ENODEV), a reader holding the file open must not keep seeing the old value: the file is
    emptied in place first (an empty read is unparsable), then removed."""
    d = board._zones[kind]
    with contextlib.suppress(FileNotFoundError):
        os.truncate(d / "temp", 0)
    if whole_dir:
        shutil.rmtree(d)
    else:
        (d / "temp").unlink()


def restore_zone(board: FakeBoard, kind: str, temp_c: float) -> None:
    d = board._zones[kind]
    if not d.exists():
        d.mkdir(parents=True)
        _put(d / "type", board._types.get(kind, kind) + "\n")
        for i, (tkind, ttemp) in enumerate(ORIN_TRIPS):
            _put(d / f"trip_point_{i}_type", tkind + "\n")
            _put(d / f"trip_point_{i}_temp", f"{int(round(ttemp * 1000))}\n")
    board.set_temp(kind, temp_c)


def set_raw(board: FakeBoard, kind: str, text: str) -> None:
    """Write raw bytes into a zone's ``temp`` (garbage, INT_MIN, -273150, ...)."""
    _put(board._zones[kind] / "temp", text)
