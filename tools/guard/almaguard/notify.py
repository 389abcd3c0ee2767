"""sd_notify(3) over $NOTIFY_SOCKET with the stdlib socket module (no libsystemd)."""

from __future__ import annotations

import os
import socket


class Notifier:
    """Sends READY=1, WATCHDOG=1, STATUS=... to systemd; a no-op outside a notify unit."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        addr = env.get("NOTIFY_SOCKET", "")
        self.address: str | bytes | None = None
        if addr.startswith("@"):
            self.address = b"\0" + addr[1:].encode()  # abstract namespace
        elif addr.startswith("/"):
            self.address = addr
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        self.watchdog_s: float | None = None
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_s = int(usec) / 1e6
        self._sock: socket.socket | None = None
        self._pending_status: str | None = None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> bool:
        if self.address is None:
            return False
        try:
            if self._sock is None:
                # Non-blocking: a receiver that stops reading (a full queue) must never stall
                # the guard's loop; the datagram is dropped and reported instead (invariant 4).
                self._sock = socket.socket(
                    socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
                )
            self._sock.sendto("\n".join(fields).encode(), self.address)
            return True
        except OSError:
            return False  # systemd gone or socket full: the watchdog will notice, nothing to do here

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}")

    def keepalive(self) -> bool:
        if self._pending_status is not None:  # a STATUS= that could not be sent: latest wins
            if self.send("WATCHDOG=1", f"STATUS={self._pending_status}"):
                self._pending_status = None
                return True
            return False
        return self.send("WATCHDOG=1")

    def status(self, text: str) -> bool:
        sent = self.send(f"STATUS={text}")
        self._pending_status = None if sent or self.address is None else text
        return sent

    def stopping(self) -> bool:
        return self.send("STOPPING=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
