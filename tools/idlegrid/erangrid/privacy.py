"""Privacy by construction: the agent has no sensors, and proves it at start and every poll.

The sensor set is module-level, empty and immutable. Nothing in this package opens a device
that can capture its owner; ``assert_no_sensor_fds`` checks our own open files anyway, so a
library (or a future change) that opens one makes the agent refuse to run.

Devices are recognised by their character-device major number, not by path: a renamed node
or a symlink is still caught, and this file names no device path (tests grep the package
for such paths and fail on any).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import PrivacyViolation

# The set of sensors ERAN-GRID may read. Empty by design; frozenset so nothing can add to it.
SENSORS: frozenset[str] = frozenset()

# Fixed Linux majors (Documentation/admin-guide/devices.txt): 13 input core, 14 OSS sound,
# 81 video capture, 116 sound. Misc 10:223 lets a process inject input events.
_CAPTURE_MAJORS = frozenset({13, 14, 81, 116})
_CAPTURE_MISC = frozenset({(10, 223)})
# Majors allocated at boot: look their names up in /proc/devices.
_DYNAMIC_NAMES = frozenset({"hidraw", "media"})


def assert_empty_sensor_set() -> None:
    """Fail loudly if anyone managed to give the agent a sensor."""
    if not isinstance(SENSORS, frozenset) or len(SENSORS) != 0:
        raise PrivacyViolation(f"sensor set must be empty, found {sorted(SENSORS)}")


def dynamic_capture_majors(proc_devices: Path = Path("/proc/devices")) -> frozenset[int]:
    majors: set[int] = set()
    try:
        text = proc_devices.read_text()
    except OSError:
        return frozenset()
    in_char = False
    for line in text.splitlines():
        if line.startswith("Character devices"):
            in_char = True
        elif line.startswith("Block devices"):
            in_char = False
        elif in_char:
            parts = line.split()
            if len(parts) == 2 and parts[1] in _DYNAMIC_NAMES and parts[0].isdigit():
                majors.add(int(parts[0]))
    return frozenset(majors)


def is_capture_device(st: os.stat_result, extra_majors: frozenset[int] = frozenset()) -> bool:
    if not stat.S_ISCHR(st.st_mode):
        return False
    major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    return major in _CAPTURE_MAJORS or major in extra_majors or (major, minor) in _CAPTURE_MISC


def assert_no_sensor_fds(fd_dir: Path = Path("/proc/self/fd"), extra_majors: frozenset[int] | None = None) -> None:
    """Refuse if any of our open file descriptors is a capture device. ``extra_majors``
    defaults to the dynamic majors read from /proc/devices (callers polling often cache them)."""
    extra = dynamic_capture_majors() if extra_majors is None else extra_majors
    base = str(fd_dir)
    try:
        names = os.listdir(base)
    except OSError as exc:
        raise PrivacyViolation(f"cannot list {fd_dir} to prove no sensor is open: {exc}") from exc
    for name in names:
        try:
            st = os.stat(f"{base}/{name}")  # follows the fd's magic link to the open file
        except OSError:
            continue  # closed between listdir and stat (the listdir fd itself)
        if is_capture_device(st, extra):
            target = os.readlink(fd_dir / name) if os.path.islink(fd_dir / name) else name
            raise PrivacyViolation(
                f"open file descriptor {name} is a capture device ({target}, "
                f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}): ERAN-GRID never holds one",
                hint="find what opened it (a library or plugin) and remove it",
            )
