"""One flasher per board, whoever runs it: ``flock(2)`` on the board's own USB device node.

The lock is the node udev made for the board in recovery mode (``/dev/bus/usb/BBB/DDD``,
its ``DEVNAME``), which every flasher of that board opens anyway (tegrarcm_v2 through
libusb). So two ``alma flash`` runs of one board exclude each other whatever user runs them
and whatever their environment says: there is no lock directory to point elsewhere and no
lock file that could go stale or be created with the wrong owner. flock dies with its
process (crash, kill -9), so nothing can lock anyone out.

The lock lives as long as the flasher: its descriptor is inherited by the board's
initrd-flash (``pass_fds``; every process of its group that keeps it holds the lock), so
a killed alma leaves a running flasher still locked, and the board free only once the
flasher's processes are gone.

What it cannot do: stop a flasher that takes no lock (NVIDIA's own flash.sh run by hand).
Opening the node needs read access: root, or the plugdev group (``alma setup udev``).
The holder's pid is not stored anywhere (nothing to write into a device node); the
refusal names the board and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os

from alma.errors import UserError


class BoardLock:
    def __init__(self, usb_instance: str, device_node: str | None) -> None:
        self.usb_instance = usb_instance
        self.device_node = device_node
        self._fd: int | None = None

    def acquire(self) -> None:
        if not self.device_node:
            raise UserError(
                f"board {self.usb_instance} has no USB device node (udev gave it no DEVNAME): cannot lock it",
                hint="check that udev runs on this host (alma boards), then flash again",
            )
        try:
            # O_NONBLOCK: never wait on a device; the node is only held, never read
            fd = os.open(self.device_node, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError as exc:
            gone = exc.errno in (errno.ENOENT, errno.ENODEV, errno.ENXIO)
            raise UserError(
                f"cannot open board {self.usb_instance}'s device node {self.device_node} to lock it: {exc.strerror}",
                hint="the board left recovery mode (alma boards --wait)"
                if gone
                else "run alma setup udev and join the plugdev group, or run as root",
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(
                f"board {self.usb_instance} is already being flashed by another alma flash "
                f"(its device node {self.device_node} is locked)",
                hint="wait for it to finish (alma boards shows the board's state); never flash one board twice at once",
            ) from None
        self._fd = fd

    @property
    def fd(self) -> int | None:
        """The locked descriptor, to hand to the flasher (it holds the lock while it runs)."""
        return self._fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> BoardLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
