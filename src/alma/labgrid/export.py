"""The exporter side: ``AlmaRecoveryBoard`` exported as ``NetworkAlmaRecoveryBoard``.

labgrid 26 has no plugin discovery: an exporter knows a resource class only if it is in
``labgrid.remote.exporter.exports`` when the exporter reads its config. ``alma-labgrid-exporter``
(this module's ``main``) registers ours and then runs labgrid's own exporter main, arguments
unchanged.

While a place holds the board, the flash service (alma.labgrid.service) runs as a child of
the exporter; its port goes into the published parameters. Unlike ser2net for a serial port,
the service keeps running while the board is not in recovery mode: a flash makes it
re-enumerate (flashpkg gadget, rootfs export, the booted system), and stopping the flash
there would break it. The service's stdin is a pipe from the exporter, so when the exporter
dies (killed or not) the service sees EOF, interrupts a running flash (INTERRUPTED record)
and exits.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from typing import Any

import attr
from labgrid.remote import exporter as lg_exporter

from alma.labgrid.resource import AlmaRecoveryBoard

START_TIMEOUT_S = 30.0  # the service prints its port within this (a loaded host is slow to import)
STOP_GRACE_S = 20.0  # an interrupted flash writes its record in this


@attr.s(eq=False)
class AlmaRecoveryBoardExport(lg_exporter.ResourceExport):
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.local = AlmaRecoveryBoard(target=None, name=None, **self.local_params)
        if self.local.usb_path is None:  # the stable key: an exported board is always named by it
            raise lg_exporter.ExporterError("AlmaRecoveryBoard: usb_path is required in an exporter config")
        self.data["cls"] = "NetworkAlmaRecoveryBoard"
        self.child: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self.flashing = False
        self._out = b""

    # -- the service child ---------------------------------------------------------
    def _start_service(self) -> None:
        assert self.child is None
        usb_path = self.local.usb_path
        cmd = [sys.executable, "-m", "alma.labgrid", "--board", usb_path]  # the flash service
        if self.local.console:
            cmd += ["--console", self.local.console]
        for d in self.local.bundle_dirs:
            cmd += ["--bundle-dir", d]
        self.child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.child.stdout is not None
        fd = self.child.stdout.fileno()
        os.set_blocking(fd, False)
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.port is None:
            left = deadline - time.monotonic()
            if left <= 0 or self.child.poll() is not None:
                self._stop_service()
                raise lg_exporter.ExporterError(f"flash service for {usb_path} did not start")
            select.select([fd], [], [], min(left, 0.5))
            self._read_child()
        self.logger.info("flash service for %s on port %d", usb_path, self.port)

    def _read_child(self) -> None:
        if self.child is None or self.child.stdout is None:
            return
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(self.child.stdout.fileno(), 4096):
                self._out += chunk
        while b"\n" in self._out:
            line, self._out = self._out.split(b"\n", 1)
            text = line.decode("ascii", "replace").strip()
            if text.startswith("listening ") and text[10:].isdigit():
                if self.port is None and 0 < int(text[10:]) < 65536:  # once: later lines cannot move it
                    self.port = int(text[10:])
            elif text == "flash-start":
                self.flashing = True
            elif text == "flash-end":
                self.flashing = False

    def _stop_service(self) -> None:
        child, self.child = self.child, None
        self.port, self.flashing, self._out = None, False, b""
        if child is None:
            return
        if child.stdin is not None:
            with contextlib.suppress(OSError):
                child.stdin.close()  # the service stops; a running flash is interrupted and recorded
        try:
            child.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(5)
        if child.stdout is not None:
            child.stdout.close()

    def _start(self, start_params: dict[str, Any]) -> None:
        self._start_service()

    def _stop(self, start_params: dict[str, Any]) -> None:
        self._stop_service()

    # -- what the coordinator sees -------------------------------------------------
    def _get_params(self) -> dict[str, Any]:
        board = self.local.board if self.local.avail else None
        return {
            "host": self.host,
            "busnum": self.local.busnum,
            "devnum": self.local.devnum,
            "path": self.local.path,
            "vendor_id": self.local.vendor_id,
            "model_id": self.local.model_id,
            "usb_path": self.local.usb_path,
            "module": board.module if board is not None else None,
            "port": self.port,
            "flashing": self.flashing,
        }

    def poll(self) -> bool:
        self.local.poll()
        self._read_child()
        if self.child is not None and self.child.poll() is not None:
            self.logger.warning("flash service exited (%s)", self.child.returncode)
            self._stop_service()
            self.start_params = None
        if not self.broken:
            if self.acquired and self.start_params is None:
                self.start()
            elif not self.acquired and self.start_params is not None:
                self.stop()
        dirty = False
        # available: in recovery mode, or being flashed (re-enumerating) by its holder
        avail = (self.local.avail or self.flashing) and not self.broken
        if self.avail != avail:
            self.data["avail"] = avail
            dirty = True
        params = self._get_params()
        params["extra"] = {"proxy_required": self.proxy_required, "proxy": self.proxy}
        if self.broken:
            params["extra"]["broken"] = self.broken
        if self.params != params:
            self.data["params"].update(params)
            dirty = True
        return dirty


def register() -> None:
    lg_exporter.exports["AlmaRecoveryBoard"] = AlmaRecoveryBoardExport


def main() -> None:
    """``alma-labgrid-exporter``: labgrid-exporter with the ALMA resources known."""
    register()
    lg_exporter.main()


if __name__ == "__main__":
    main()
