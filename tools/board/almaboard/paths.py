"""Machine paths under an optional root prefix (``--root DIR`` for tests and fake trees)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Paths:
    """Every path the on-board tools read or write, prefixed by ``root``.

    ``root`` is "/" on a board. With ``--root DIR`` every machine path (/sys, /proc, /dev,
    /run, /var/lib and /etc) lives under DIR, so a test (or ``alma fleet`` over SSH) can
    point the tools at a fake tree.
    """

    root: Path = Path("/")

    def __call__(self, path: str) -> Path:
        """``path`` (absolute, as on the board) under the root."""
        if not path.startswith("/"):
            raise ValueError(f"machine path must be absolute: {path}")
        if self.root == Path("/"):
            return Path(path)
        return self.root / path.lstrip("/")

    @property
    def thermal(self) -> Path:
        return self("/sys/class/thermal")

    @property
    def net(self) -> Path:
        return self("/sys/class/net")

    @property
    def watchdog(self) -> Path:
        return self("/sys/class/watchdog")

    @property
    def cgroup(self) -> Path:
        return self("/sys/fs/cgroup")

    @property
    def proc(self) -> Path:
        return self("/proc")

    @property
    def boot_id_file(self) -> Path:
        return self("/proc/sys/kernel/random/boot_id")

    @property
    def kmsg(self) -> Path:
        return self("/dev/kmsg")

    @property
    def guard_run(self) -> Path:
        return self("/run/alma-guard")

    @property
    def guard_state(self) -> Path:
        return self("/run/alma-guard/state.json")

    @property
    def guard_state_fallback(self) -> Path:
        """Where the guard writes its state when /run/alma-guard is not writable."""
        return self("/var/lib/alma-guard/state.json")

    @property
    def guard_lib(self) -> Path:
        return self("/var/lib/alma-guard")

    @property
    def health_lib(self) -> Path:
        return self("/var/lib/alma-health")

    @property
    def etc_alma(self) -> Path:
        return self("/etc/alma")


def from_root(root: str | os.PathLike[str] | None) -> Paths:
    return Paths(Path(root).resolve() if root else Path("/"))
