"""A real nats-server (Debian's) on loopback with JetStream in a temp dir: ERAN-GRID's and
ERANCLOUD's tests share it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from support import DEADLINE_S


class NatsServer:
    """A real nats-server (Debian's) on 127.0.0.1 with JetStream in a temp dir."""

    def __init__(self, binary: str, store: Path, config: Path | None = None) -> None:
        import socket

        self.binary = binary
        self.store = store
        self.config = config  # a server config file (auth): it names the port and store itself
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"nats://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = store.parent / "nats-server.log"

    def start(self) -> None:
        import socket

        args = [self.binary, "-js", "-sd", str(self.store), "-a", "127.0.0.1", "-p", str(self.port)]
        if self.config is not None:
            args = [self.binary, "-c", str(self.config)]
        self.proc = subprocess.Popen(args, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)  # noqa: SIM115
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"nats-server did not listen within {DEADLINE_S:.0f} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
