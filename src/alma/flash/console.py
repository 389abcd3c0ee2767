"""Watch a board's serial console (pyserial) and say whether it booted.

The debug UART of an Orin is ``ttyTCU0`` at 115200 8N1; on the host it appears as a USB
serial device (the AGX devkit's micro-USB debug port, or a USB-TTL adapter on the Orin
Nano/NX header). A boot is *seen* when, after the flash finished, the console shows a
login prompt; the kernel's ``Linux version ...`` banner is recorded with it.

The watcher reads in its own thread from before the flash starts (the board reboots the
moment it reports its final status, so opening the port afterwards can miss the banner),
and only lines after ``mark()`` count: the flashing initrd prints a kernel banner too.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import serial
from almaboard import text as T

from alma.flash.identity import board_identity
from alma.flash.records import Boot
from alma.ground import utc_iso

BAUD = 115200
INTERRUPTED_REASON = "interrupted while watching"
KERNEL_BANNER = re.compile(r"Linux version \S+")
LOGIN_PROMPT = re.compile(r"^\s*(?P<prompt>[A-Za-z0-9][A-Za-z0-9._-]* login:)\s*$")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _clean(line: str) -> str:
    # CSI colour codes dropped, every other control/ESC/bidi character made visible (almaboard.text)
    return T.terminal(_ANSI.sub("", line).replace("\r", "").rstrip())


def _printable_ratio(data: bytes) -> float:
    if not data:
        return 1.0
    ok = sum(1 for b in data if 32 <= b < 127 or b in (9, 10, 13))
    return ok / len(data)


class ConsoleWatcher:
    def __init__(
        self,
        port: str,
        *,
        baud: int = BAUD,
        opener: Callable[..., Any] | None = None,
    ) -> None:
        self.port = port
        self.baud = baud
        self._opener = opener or serial.Serial
        self._lines: list[tuple[float, str]] = []  # (time, cleaned line), complete lines
        self._partial = b""
        self._mark = 0.0
        self._bytes = 0
        self._bytes_after_mark = 0
        self._printable_after_mark = 0
        self._error: str | None = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ser: Any = None

    # -- reader thread -------------------------------------------------------------
    def start(self) -> None:
        try:
            self._ser = self._opener(self.port, self.baud, timeout=0.2)
        except (serial.SerialException, OSError) as exc:
            self._error = f"cannot open console {self.port}: {exc}"
            return
        self._thread = threading.Thread(target=self._read, name=f"console {self.port}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                # One byte (or the 0.2 s timeout), then what is already buffered, so lines get
                # the time they arrived. Not in_waiting: its ioctl fails on some ttys (umockdev).
                data = self._ser.read(1)
                if data:
                    with contextlib.suppress(BlockingIOError):  # pyserial opens O_NONBLOCK
                        data += os.read(self._ser.fileno(), 4096)
            except (serial.SerialException, OSError) as exc:
                with self._cond:
                    self._error = f"console {self.port} unplugged ({exc})"
                    self._cond.notify_all()
                return
            if not data:
                continue
            self._feed(data)

    def _feed(self, data: bytes) -> None:
        with self._cond:
            self._bytes += len(data)
            if self._mark:
                self._bytes_after_mark += len(data)
                self._printable_after_mark += int(len(data) * _printable_ratio(data))
            buf = self._partial + data
            *complete, self._partial = buf.split(b"\n")
            now = time.monotonic()
            for raw in complete:
                self._lines.append((now, _clean(raw.decode("utf-8", "replace"))))
            self._cond.notify_all()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._ser is not None:
            with contextlib.suppress(serial.SerialException, OSError):
                self._ser.close()

    # -- judgement -----------------------------------------------------------------
    def mark(self) -> None:
        """From now on, lines count as the new system's boot."""
        with self._cond:
            self._mark = time.monotonic()
            if self._partial:  # a half line from before the mark is old news too
                self._lines.append((self._mark - 1e-3, _clean(self._partial.decode("utf-8", "replace"))))
                self._partial = b""

    def _after_mark(self) -> list[str]:
        lines = [ln for t, ln in self._lines if t >= self._mark]
        tail = _clean(self._partial.decode("utf-8", "replace"))
        return [*lines, tail] if tail else lines

    def _judge(self) -> tuple[str | None, str | None]:
        banner = prompt = None
        for ln in self._after_mark():
            if banner is None:
                m = KERNEL_BANNER.search(ln)
                if m:
                    banner = ln[m.start() :]
            m2 = LOGIN_PROMPT.match(ln)
            if m2:
                prompt = m2["prompt"]
        return banner, prompt

    def wait_for_boot(self, timeout: float, cancel: threading.Event | None = None) -> Boot:
        """Block until a login prompt appears after ``mark()``, the timeout passes, or
        ``cancel`` is set (Ctrl-C: the record says so)."""
        if not self._mark:
            self.mark()
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                banner, prompt = self._judge()
                if prompt is not None:
                    ident, problem = board_identity(self._after_mark())
                    return Boot(
                        seen=True,
                        console=self.port,
                        kernel_banner=banner,
                        login_prompt=prompt,
                        seen_at=utc_iso(),
                        board=ident,  # the pinned host key (one distinct identity only)
                        identity_problem=problem,
                    )
                if self._error is not None:
                    return Boot(seen=False, console=self.port, kernel_banner=banner, reason=self._error)
                if cancel is not None and cancel.is_set():
                    return Boot(seen=False, console=self.port, kernel_banner=banner, reason=INTERRUPTED_REASON)
                left = end - time.monotonic()
                if left <= 0:
                    why = self._why_not(banner, timeout)
                    return Boot(seen=False, console=self.port, kernel_banner=banner, reason=why)
                self._cond.wait(timeout=min(left, 0.5))

    def _why_not(self, banner: str | None, timeout: float) -> str:
        if self._bytes_after_mark == 0:
            return (
                f"timeout: silence on {self.port} for {timeout:.0f} s "
                "(check the UART wiring, the port, and that the board powered on)"
            )
        if banner is None and self._printable_after_mark < 0.8 * self._bytes_after_mark:
            return f"garbage only on {self.port} (wrong baud rate? ttyTCU0 runs at {BAUD} 8N1)"
        if banner is not None:
            return f"timeout: the kernel started but no login prompt within {timeout:.0f} s"
        return f"timeout: no kernel banner and no login prompt within {timeout:.0f} s"


def find_console(board_sys_path: str | None, context: Any = None, *, only_one_ok: bool = True) -> str | None:
    """The USB serial port that most likely is this board's debug UART, or None.

    Prefers a USB serial device on the same hub as the board (one station slot: board and
    its UART adapter side by side); otherwise, when ``only_one_ok`` (a single board is being
    flashed), the only USB serial device on the host.
    """
    import pyudev

    ctx = context or pyudev.Context()
    ttys = []
    for dev in ctx.list_devices(subsystem="tty"):
        usb = dev.find_parent("usb", "usb_device")
        if usb is None or dev.device_node is None:
            continue
        ttys.append((dev.device_node, usb.sys_path))
    if not ttys:
        return None
    if board_sys_path:
        hub = str(Path(board_sys_path).parent)
        near = [node for node, usb_path in ttys if str(Path(usb_path).parent) == hub]
        if len(near) == 1:
            return near[0]
    return ttys[0][0] if only_one_ok and len(ttys) == 1 else None
