"""Boot confirmation on a real tty: a pty pair, pyserial on the slave, a simulated Orin
writing to the master (ttyTCU0 boot log, garbage, silence, unplug)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

import pytest
from support_flash import BOOT_LOG, FLASHING_INITRD

from alma.flash.console import ConsoleWatcher


class FakeBoard:
    """The board's side of the console: the pty master."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        self.port = os.ttyname(self.slave)

    def write(self, data: bytes, chunk: int = 64, pause: float = 0.002) -> None:
        for i in range(0, len(data), chunk):
            os.write(self.master, data[i : i + chunk])
            time.sleep(pause)

    def later(self, delay: float, data: bytes) -> threading.Thread:
        t = threading.Thread(target=lambda: (time.sleep(delay), self.write(data)), daemon=True)
        t.start()
        return t

    def unplug(self) -> None:
        os.close(self.master)
        self.master = -1

    def close(self) -> None:
        for fd in (self.master, self.slave):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


@pytest.fixture
def board() -> Iterator[FakeBoard]:
    b = FakeBoard()
    yield b
    b.close()


def _watch(board: FakeBoard) -> ConsoleWatcher:
    w = ConsoleWatcher(board.port)
    w.start()  # open the port before the board writes (docs/flash.md)
    return w


def test_login_prompt_after_the_flash_means_booted(board: FakeBoard) -> None:
    w = _watch(board)
    try:
        board.write(FLASHING_INITRD)  # the flashing initrd's kernel: must not count
        time.sleep(0.1)
        w.mark()
        board.later(0.05, BOOT_LOG)
        boot = w.wait_for_boot(5)
    finally:
        w.stop()
    assert boot.seen is True
    assert boot.console == board.port
    assert boot.login_prompt == "alma-orin login:"
    assert boot.kernel_banner is not None
    assert boot.kernel_banner.startswith("Linux version 5.15.185-l4t-r36.5-1033.33 (oe-user@oe-host) (aarch64")
    assert boot.seen_at and boot.seen_at.endswith("Z")


def test_initrd_banner_before_the_mark_does_not_count(board: FakeBoard) -> None:
    w = _watch(board)
    try:
        board.write(FLASHING_INITRD + b"alma-orin login: \r\n")  # even a prompt before the mark is old news
        time.sleep(0.15)
        w.mark()
        boot = w.wait_for_boot(0.4)
    finally:
        w.stop()
    assert boot.seen is False
    assert boot.kernel_banner is None
    assert boot.reason is not None and "silence" in boot.reason


def test_silence_is_a_timeout_that_says_so(board: FakeBoard) -> None:
    w = _watch(board)
    try:
        w.mark()
        t0 = time.monotonic()
        boot = w.wait_for_boot(0.5)
        took = time.monotonic() - t0
    finally:
        w.stop()
    assert boot.seen is False
    assert boot.reason is not None and boot.reason.startswith("timeout: silence")
    assert 0.45 <= took < 120  # never before its timeout; the upper bound only catches a hang


def test_garbage_says_wrong_baud_rate(board: FakeBoard) -> None:
    w = _watch(board)
    try:
        w.mark()
        # what 115200 looks like read at the wrong speed: high bytes, no newlines
        board.later(0.02, bytes((0x80 + (i * 37) % 127) for i in range(2000)))
        boot = w.wait_for_boot(0.6)
    finally:
        w.stop()
    assert boot.seen is False
    assert boot.reason is not None and "garbage" in boot.reason and "115200" in boot.reason


def test_kernel_without_prompt_is_a_timeout_with_the_banner(board: FakeBoard) -> None:
    w = _watch(board)
    try:
        w.mark()
        board.later(0.02, BOOT_LOG.split(b"[    1.98")[0])  # stops before systemd: a hang in early boot
        boot = w.wait_for_boot(0.6)
    finally:
        w.stop()
    assert boot.seen is False
    assert boot.kernel_banner is not None and "5.15.185-l4t-r36.5" in boot.kernel_banner
    assert boot.reason is not None and "kernel started but no login prompt" in boot.reason


def test_unplugged_console_is_reported_not_a_traceback(board: FakeBoard) -> None:
    w = _watch(board)
    try:
        w.mark()
        board.write(BOOT_LOG[:200])
        time.sleep(0.05)
        board.unplug()  # closing the master: reads on the slave fail (SerialException)
        t0 = time.monotonic()
        boot = w.wait_for_boot(600)
        took = time.monotonic() - t0
    finally:
        w.stop()
    assert boot.seen is False
    assert boot.reason is not None and "unplugged" in boot.reason
    assert took < 300  # reported when it happens, not after the 600 s timeout


def test_missing_port_is_reported(tmp_path: object) -> None:
    w = ConsoleWatcher("/dev/ttyUSB-alma-does-not-exist")
    w.start()
    try:
        boot = w.wait_for_boot(0.2)
    finally:
        w.stop()
    assert boot.seen is False
    assert boot.reason is not None and "cannot open console" in boot.reason
