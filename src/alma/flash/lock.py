"""One flasher per board: an flock(2) on ``<lock dir>/alma-flash-<usb instance>.lock``.

flock dies with its process, so a crashed flasher never leaves a stale lock; the pid
written into the file only serves the error message.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from alma.errors import UserError

DEFAULT_LOCK_DIR = Path("/run/lock")


def lock_dir() -> Path:
    return Path(os.environ.get("ALMA_LOCK_DIR") or DEFAULT_LOCK_DIR)


def lock_path(usb_instance: str, directory: Path | None = None) -> Path:
    safe = usb_instance.replace("/", "_")
    return (directory or lock_dir()) / f"alma-flash-{safe}.lock"


class BoardLock:
    def __init__(self, usb_instance: str, directory: Path | None = None) -> None:
        self.usb_instance = usb_instance
        self.path = lock_path(usb_instance, directory)
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o664)
        except OSError as exc:
            raise UserError(
                f"cannot create the board lock {self.path}: {exc.strerror}",
                hint="set ALMA_LOCK_DIR to a writable directory, or run alma setup udev and use the plugdev group",
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = ""
            with contextlib.suppress(OSError, ValueError):
                holder = os.pread(fd, 64, 0).decode().strip()
            os.close(fd)
            who = f" (pid {holder})" if holder else ""
            raise UserError(
                f"board {self.usb_instance} is already being flashed by another alma flash{who}",
                hint="wait for it to finish (alma boards shows the board's state); never flash one board twice at once",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> BoardLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
