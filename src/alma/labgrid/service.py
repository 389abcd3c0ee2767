"""The flash service on an exporter: ``alma flash`` for one board, reachable by the place holder.

``alma-labgrid-exporter`` starts one per exported ``AlmaRecoveryBoard`` when a place acquires
it and stops it on release (the way labgrid's exporter runs ser2net for a serial port). The
client's ``AlmaFlashDriver`` connects, names the bundle (file name, size, the sha256 its own
facts manifest expects) and, unless the exporter already has that file (shared storage, same
host), streams it. The flash itself is ``FlashSession``: the same verification, limits, lock,
records and reasons as ``alma flash --board USB_PATH``; the record is written on the exporter
and sent back.

Protocol ``alma-flash/1`` (one TCP connection per flash; JSON lines, each at most 64 KiB):

    client: {"proto": "alma-flash/1", "op": "flash", "name", "size", "sha256", "path"?, "options"?}
    server: {"upload": true|false}           then, if true, exactly ``size`` raw bytes from the client
    server: {"event": "line", "phase", "text"} ...   (progress; text is the flash tool's output)
    server: {"event": "probe"}               (after the client half-closed: see peer_state)
    server: {"result": <flash record>, "record_path", "exit_code"}   or   {"error", "hint", "record"?}

Threat model (docs/labgrid.md#threat-model): whoever reaches the port can ask for a flash of
*a bundle whose hash they name*; they cannot choose the board (fixed at start), a path on the
exporter (uploads go to a fresh private directory under a name that matched the bundle-name
grammar; a ``path`` is used in place only inside the exporter's configured ``bundle_dirs``,
anything else is answered like a missing file), options beyond initrd-flash's recorded ones,
or bypass the verification (the session hashes every byte against the sha256 before anything
touches the board). Messages are bounded in size and time (the request within REQUEST_S, an
upload at UPLOAD_MIN_RATE after a grace); a malformed or late one ends the connection with an
error and nothing written. The
service stops (and an interrupted flash gets its INTERRUPTED record) when the exporter goes
away (its stdin pipe closes), on SIGTERM/SIGINT, and when the client's connection drops.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import select
import shutil
import socket
import stat
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from alma.errors import AlmaError, UserError
from alma.flash.flasher import FlashArgs
from alma.flash.interrupt import Interruption
from alma.flash.protocol import PHASES
from alma.flash.session import FlashOptions, FlashSession
from alma.labgrid.resource import USB_PATH
from alma.tegraflash.names import parse_name

PROTO = "alma-flash/1"
MAX_MESSAGE = 64 * 1024
MAX_BUNDLE = 64 << 30  # a real bundle is ~1.6 GB; anything past this is not one
UPLOAD_MARGIN = 256 << 20  # keep this much free after an upload
IDLE_S = 60.0  # a peer that sends nothing for this long is dropped
REQUEST_S = 30.0  # the whole request line arrives within this
# An upload may take UPLOAD_GRACE_S plus one second per UPLOAD_MIN_RATE bytes: a peer trickling
# bytes (or naming a huge size and sending little) cannot hold the service for the place holder.
UPLOAD_GRACE_S = 30.0
UPLOAD_MIN_RATE = 1 << 20  # bytes/s: 8 Mbit/s; slower links share the bundle's directory instead
# Uploads may take at most this much of the exporter's disk (a real bundle is ~1.6 GB): a peer
# naming 64 GiB is refused at once, not after hours of trickling into the disk.
UPLOAD_BUDGET = 16 << 30
STOP_JOIN_S = 30.0  # on stop, how long the flash in progress gets to write its INTERRUPTED record
# A request finding the board's one flash slot taken waits this long (a finished client's upload
# being torn down), then is answered "busy": well inside the driver's 30 s connect timeout.
SLOT_WAIT_S = 10.0
MAX_PEERS = 16  # connections served at once (each reading its request); more are closed at once
# Why a flash was stopped when its client went away (the record's reason says which).
CLOSED = "the client closed its connection (it gave up, was stopped or died)"
VANISHED = "the client vanished: its connection broke"
# After its request (and upload) a client sends nothing, so an end of stream means one of two
# things only its kernel can tell: it shut its sending side (shutdown(SHUT_WR)): it still reads
# and is served; or it closed the socket: it reads nothing and its kernel answers any data with
# a reset. A probe line tells them apart: acknowledged = half-closed, reset = closed.
PROBE_S = 10.0  # for the probe's acknowledgement or reset: many round trips of any lab network
TCP_CLOSE = 7  # include/net/tcp_states.h: where a reset leaves our socket
SIOCOUTQ = 0x5411  # linux/sockios.h: bytes sent and not yet acknowledged (plus unsent ones)
OPEN, HALF_CLOSED = "open", "half-closed"
SHA256 = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 1 << 20


class ProtocolError(UserError):
    """The peer broke the protocol: the connection ends with this message."""


def send(sock: socket.socket, msg: dict[str, Any]) -> None:
    data = json.dumps(msg, sort_keys=True).encode() + b"\n"
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    sock.sendall(data)


class LineReader:
    """Bounded JSON lines from a socket (a line longer than MAX_MESSAGE is an error)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def read(self, deadline: float | None = None) -> dict[str, Any] | None:
        """The next message; with ``deadline`` (time.monotonic()), all of it by then."""
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_MESSAGE:
                raise ProtocolError(f"message longer than {MAX_MESSAGE} bytes")
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ProtocolError("the message did not arrive in time")
                self.sock.settimeout(min(left, IDLE_S))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise ProtocolError("the message did not arrive in time") from None
                raise
            if not chunk:
                if self.buf:
                    raise ProtocolError("connection closed in the middle of a message")
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        if len(line) > MAX_MESSAGE:
            raise ProtocolError(f"message longer than {MAX_MESSAGE} bytes")
        try:
            msg = json.loads(line)
        except ValueError as exc:
            raise ProtocolError(f"not a JSON message: {exc}") from None
        if not isinstance(msg, dict):
            raise ProtocolError("a message must be a JSON object")
        return msg

    def take_raw(self, n: int) -> bytes:
        """Up to n bytes already buffered (the start of an upload)."""
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def _float(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not (0 < float(v) <= 86400):
        raise ProtocolError(f"{where}: a number of seconds in (0, 86400] expected")
    return float(v)


def parse_request(msg: dict[str, Any]) -> dict[str, Any]:
    """Check a flash request against its grammar; return the checked fields."""
    if msg.get("proto") != PROTO or msg.get("op") != "flash":
        raise ProtocolError(f"expected a {PROTO} flash request")
    unknown = set(msg) - {"proto", "op", "name", "size", "sha256", "path", "options"}
    if unknown:
        raise ProtocolError(f"unknown request fields: {', '.join(sorted(unknown))}")
    name, size, sha = msg.get("name"), msg.get("size"), msg.get("sha256")
    if not isinstance(name, str) or "/" in name or len(name) > 255 or parse_name(name) is None:
        raise ProtocolError("name: not a bundle file name (<image>-<machine>.rootfs[-STAMP].tegraflash.tar.gz|zip)")
    if isinstance(size, bool) or not isinstance(size, int) or not (0 < size <= MAX_BUNDLE):
        raise ProtocolError(f"size: a byte count in (0, {MAX_BUNDLE}] expected")
    if not isinstance(sha, str) or not SHA256.fullmatch(sha):
        raise ProtocolError("sha256: 64 lowercase hex digits expected")
    path = msg.get("path")
    if path is not None and (not isinstance(path, str) or not path.startswith("/") or "\0" in path or len(path) > 4096):
        raise ProtocolError("path: an absolute path expected")
    opts = msg.get("options") or {}
    if not isinstance(opts, dict) or set(opts) - {"erase_nvme", "skip_bootloader", "timeouts", "boot_timeout"}:
        raise ProtocolError("options: only erase_nvme, skip_bootloader, timeouts, boot_timeout")
    for flag in ("erase_nvme", "skip_bootloader"):
        if not isinstance(opts.get(flag, False), bool):
            raise ProtocolError(f"options.{flag}: true or false")
    timeouts = opts.get("timeouts") or {}
    if not isinstance(timeouts, dict) or set(timeouts) - set(PHASES):
        raise ProtocolError(f"options.timeouts: phase names are {', '.join(PHASES)}")
    return {
        "name": name,
        "size": size,
        "sha256": sha,
        "path": path,
        "erase_nvme": opts.get("erase_nvme", False),
        "skip_bootloader": opts.get("skip_bootloader", False),
        "timeouts": {k: _float(v, f"options.timeouts.{k}") for k, v in timeouts.items()},
        "boot_timeout": _float(opts["boot_timeout"], "options.boot_timeout") if "boot_timeout" in opts else None,
    }


class Service:
    def __init__(
        self,
        board: str,
        sock: socket.socket,
        stop: Interruption,
        console: str | None = None,
        bundle_dirs: list[str] | tuple[str, ...] = (),
        upload_budget: int = UPLOAD_BUDGET,
    ) -> None:
        self.board = board
        self.upload_budget = upload_budget
        # one flash (with its upload) at a time; every other request is answered "busy" at once
        self.slot = threading.Lock()
        self.peers = threading.BoundedSemaphore(MAX_PEERS)
        self.sock = sock
        self.stop = stop
        self.console = console
        # where a peer may point us at a bundle in place (shared storage); resolved once, here
        self.bundle_dirs = [os.path.realpath(d) for d in bundle_dirs]
        self.flash_cancel: threading.Event | None = None

    def shared_bundle(self, req: dict[str, Any]) -> Path | None:
        """The request's ``path`` if it names a bundle we may use in place, else None (upload it).

        Only a regular file of the announced size, named like a bundle, whose real path lies
        inside one of ``bundle_dirs`` (the exporter's configuration, never the peer's): any other
        path on the exporter gets the same answer as a missing one, so a peer can neither
        flash nor probe (exists? that size?) files elsewhere. The session re-hashes it anyway."""
        path = req["path"]
        if path is None or not self.bundle_dirs:
            return None
        real = os.path.realpath(path)
        if not any(os.path.commonpath([real, d]) == d for d in self.bundle_dirs):
            return None
        if parse_name(os.path.basename(real)) is None:
            return None
        try:
            st = os.stat(real)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode) or st.st_size != req["size"]:
            return None
        return Path(real)

    def _upload_dir(self) -> Path:
        base = Path(
            os.environ.get("ALMA_FLASH_WORKDIR")
            or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "alma" / "flash"
        )
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        return Path(tempfile.mkdtemp(prefix="upload-", dir=base))

    def _receive(self, conn: socket.socket, reader: LineReader, req: dict[str, Any]) -> Path:
        """The bundle, streamed into a fresh private directory under its checked name."""
        updir = self._upload_dir()
        free = shutil.disk_usage(updir).free
        if free < req["size"] + UPLOAD_MARGIN:
            shutil.rmtree(updir, ignore_errors=True)
            raise UserError(
                f"no room for the {req['size']} byte bundle on the exporter ({free} bytes free in {updir.parent})",
                hint="free space on the exporter, or share the bundle's directory with it (same path, NFS)",
            )
        path = updir / req["name"]
        left = req["size"]
        deadline = time.monotonic() + UPLOAD_GRACE_S + req["size"] / UPLOAD_MIN_RATE
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as fh:
                first = reader.take_raw(left)
                fh.write(first)
                left -= len(first)
                heard = time.monotonic()
                while left > 0:
                    if self.stop.interrupted:
                        raise UserError("the exporter stopped during the upload; nothing was flashed")
                    now = time.monotonic()
                    if now >= deadline:
                        raise ProtocolError(
                            f"upload too slow: {left} of {req['size']} bytes still missing after "
                            f"{UPLOAD_GRACE_S + req['size'] / UPLOAD_MIN_RATE:.0f} s; nothing was flashed"
                        )
                    if now - heard >= IDLE_S:
                        raise ProtocolError(f"upload stalled: nothing for {IDLE_S:.0f} s; nothing was flashed")
                    conn.settimeout(max(0.01, min(1.0, deadline - now)))  # short: the stop flag is seen
                    try:
                        chunk = conn.recv(min(CHUNK, left))
                    except TimeoutError:
                        continue
                    if not chunk:
                        raise ProtocolError(f"upload ended {left} bytes short; nothing was flashed")
                    heard = time.monotonic()
                    fh.write(chunk)
                    left -= len(chunk)
        except BaseException:
            shutil.rmtree(updir, ignore_errors=True)
            raise
        return path

    def handle(self, conn: socket.socket) -> None:
        reader = LineReader(conn)
        try:
            msg = reader.read(deadline=time.monotonic() + REQUEST_S)
            conn.settimeout(IDLE_S)
            if msg is None:
                return
            req = parse_request(msg)
            shared = self.shared_bundle(req)
            if shared is None and req["size"] > self.upload_budget:
                # refused at once, slot or not: a peer naming a huge size never waits for (or
                # takes) the board's one flash slot
                raise UserError(
                    f"a {req['size']} byte bundle is over the exporter's upload budget of {self.upload_budget} "
                    "bytes; nothing was uploaded or flashed",
                    hint="share the bundle's directory with the exporter (--bundle-dir), or raise --upload-budget",
                )
            if not self.slot.acquire(timeout=SLOT_WAIT_S):
                raise UserError(
                    f"busy: another flash (or its upload) of board {self.board} is under way; nothing was flashed",
                    hint="wait for it to end (labgrid-client -v resources shows 'flashing'), then retry",
                )
            try:
                self._serve_request(conn, reader, req, shared)
            finally:
                self.slot.release()
        except (AlmaError, OSError) as exc:
            with contextlib.suppress(OSError, ProtocolError):
                send(conn, {"error": getattr(exc, "message", None) or str(exc), "hint": getattr(exc, "hint", None)})

    def _serve_request(self, conn: socket.socket, reader: LineReader, req: dict[str, Any], shared: Path | None) -> None:
        upload: Path | None = None
        try:
            if shared is not None:
                bundle = shared  # the same file (same host or shared storage): hashed by the session anyway
                send(conn, {"upload": False})
            else:
                send(conn, {"upload": True})
                upload = bundle = self._receive(conn, reader, req)
            peer = peer_state(conn)
            if peer not in (OPEN, HALF_CLOSED):
                # A client that gave up (e.g. it waited out its timeout while we served another)
                # must not get a flash nobody watches: nothing touches the board. One that only
                # half-closed still reads: it is served.
                raise ProtocolError(f"the client left before the flash began ({peer}); nothing was flashed")
            self._flash(conn, req, bundle, peer)
        finally:
            if upload is not None:
                shutil.rmtree(upload.parent, ignore_errors=True)

    def _flash(self, conn: socket.socket, req: dict[str, Any], bundle: Path, peer: str = OPEN) -> None:
        """``peer``: what ``peer_state`` found just before (a half-closed client is not probed again)."""
        cancel = self.flash_cancel = threading.Event()
        urgent = threading.Event()
        runs: list[Any] = []
        peer_lost = threading.Event()

        sending = threading.Lock()  # lines and the probe never interleave on the wire

        def on_event(kind: str, data: dict[str, Any]) -> None:
            if kind == "record":
                runs.append(data["run"])
            elif kind == "line" and not peer_lost.is_set():
                ev = data["event"]
                try:
                    with sending:
                        send(conn, {"event": "line", "phase": ev.phase, "text": ev.line[:4096]})
                except OSError:
                    lost(VANISHED)  # the client went away: stop the flash, keep its record

        def watch_peer() -> None:
            # The client sends nothing more: an end of stream is a half-close (served on) or a
            # close (stop); a reset is a vanished client. Polled, never a timeout on the socket
            # the lines are sent through.
            state = peer
            while not cancel.wait(0.2):
                if state == HALF_CLOSED:
                    with contextlib.suppress(OSError):
                        if _tcp_state(conn) == TCP_CLOSE:  # a reset answered a line: gone now
                            lost(VANISHED)
                            return
                    continue
                state = peer_state(conn, sending)
                if state not in (OPEN, HALF_CLOSED):
                    lost(state)
                    return

        def lost(cause: str) -> None:
            if not peer_lost.is_set():
                session.flasher.stop_cause = cause  # the record names why, not "Ctrl-C or SIGTERM"
                peer_lost.set()
            cancel.set()

        def watch_stop() -> None:
            while not done.wait(0.1):
                if self.stop.interrupted:
                    cancel.set()
                if self.stop.urgent.is_set():
                    urgent.set()

        opts = FlashOptions(
            bundle=bundle,
            sha256=req["sha256"],
            board=self.board,
            console=self.console,
            timeouts=req["timeouts"],
            flash_args=FlashArgs(erase_nvme=req["erase_nvme"], skip_bootloader=req["skip_bootloader"]),
        )
        if req["boot_timeout"] is not None:
            opts.boot_timeout = req["boot_timeout"]
        done = threading.Event()
        session = FlashSession(opts, on_event=on_event, cancel=cancel, urgent=urgent)
        threads = [threading.Thread(target=f, daemon=True) for f in (watch_peer, watch_stop)]
        for t in threads:
            t.start()
        _tell_exporter("flash-start")
        error: UserError | None = None
        try:
            session.run()
        except UserError as exc:
            error = exc
        finally:
            done.set()
            cancel.set()  # ends watch_peer
            for t in threads:
                t.join(2)
            _tell_exporter("flash-end")
        conn.settimeout(30)
        run = runs[-1] if runs else None
        if run is None:  # refused before a record could be written (e.g. the records dir)
            assert error is not None
            with sending:  # a watch_peer still probing (join above gave up) never interleaves
                send(conn, {"error": error.message, "hint": error.hint})
            return
        reply: dict[str, Any] = {
            "result": run.record.to_dict(),
            "record_path": str(run.path) if run.path else None,
            "exit_code": run.exit_code,
        }
        if error is not None:
            reply.update(error=error.message, hint=error.hint)
        with sending:
            send(conn, reply)

    def serve(self) -> None:
        """Every connection in its own thread: a peer that sends nothing (or trickles) costs its
        own REQUEST_S, never the place holder's answer; one flash at a time (``slot``)."""
        self.sock.settimeout(0.2)
        threads: list[threading.Thread] = []
        while not self.stop.interrupted:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            if not self.peers.acquire(blocking=False):
                conn.close()  # a flood of connections: the ones already here are served
                continue
            threads = [t for t in threads if t.is_alive()]
            t = threading.Thread(target=self._serve_one, args=(conn,), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(STOP_JOIN_S)

    def _serve_one(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(IDLE_S)  # a client that stalls mid-request is dropped
                self.handle(conn)
        finally:
            self.peers.release()


def _readable(conn: socket.socket, wait: float = 0.0) -> bool:
    """Data, an end of stream or an error waits on the socket (its timeout untouched)."""
    poller = select.poll()
    poller.register(conn, select.POLLIN | select.POLLRDHUP)
    return bool(poller.poll(wait * 1000))


def _tcp_state(conn: socket.socket) -> int:
    return int(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0])


def _unacked(conn: socket.socket) -> int:
    return int(struct.unpack("i", fcntl.ioctl(conn.fileno(), SIOCOUTQ, b"\0" * 4))[0])


def peer_state(conn: socket.socket, sending: threading.Lock | None = None, probe_s: float = PROBE_S) -> str:
    """OPEN or HALF_CLOSED while the client can still receive (half-closed: it shut its sending
    side; it is served and gets its record); else why not: CLOSED (an end of stream, then a
    reset to the probe) or VANISHED (a reset, or the probe neither acknowledged nor reset).

    ``sending`` serialises the probe with the socket's other writers."""
    try:
        if not _readable(conn):
            return OPEN  # nothing from the client: it waits for its record
        if conn.recv(MAX_MESSAGE, socket.MSG_DONTWAIT) != b"":
            return OPEN  # bytes the protocol does not have: dropped, the end of stream is looked for next
    except BlockingIOError:
        return OPEN
    except OSError:
        return VANISHED  # a reset: its process died with unread data, or its host did
    try:
        with sending or contextlib.nullcontext():
            send(conn, {"event": "probe"})
    except OSError:
        return CLOSED  # the reset was already here
    deadline = time.monotonic() + probe_s
    while time.monotonic() < deadline:
        try:
            if _tcp_state(conn) == TCP_CLOSE:
                return CLOSED  # its kernel reset the probe: the socket is closed
            if _unacked(conn) == 0:
                return HALF_CLOSED  # its kernel acknowledged the probe: it still reads
        except OSError:
            return VANISHED
        time.sleep(0.01)
    return VANISHED  # neither acknowledged nor reset: its host is gone


def _tell_exporter(line: str) -> None:
    """Busy/idle for the exporter's published state; a dead exporter (closed pipe) is no error here."""
    with contextlib.suppress(OSError, ValueError):
        print(line, flush=True)


def _watch_stdin(stop: Interruption) -> None:
    """The exporter holds our stdin open; EOF means it is gone (killed or exited)."""
    with contextlib.suppress(OSError, ValueError):
        while os.read(sys.stdin.fileno(), 4096):
            pass
    stop.cancel.set()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m alma.labgrid", description=__doc__.splitlines()[0])
    p.add_argument("--board", required=True, help="USB path of the board (alma boards), e.g. 1-8.4")
    p.add_argument("--listen", default="0.0.0.0", help="address to listen on (port: a free one, printed)")
    p.add_argument("--console", default=None, help="the board's serial console (a port, or auto)")
    p.add_argument("--no-stdin-watch", action="store_true", help="do not stop when stdin closes")
    p.add_argument("--upload-budget", type=float, default=UPLOAD_BUDGET / 1e9, metavar="GB",
                   help="largest bundle a peer may upload (default %(default).0f)")  # fmt: skip
    p.add_argument("--bundle-dir", action="append", default=[], metavar="DIR",
                   help="a directory whose bundles a peer may name by path (shared storage); repeatable; "
                        "without one every bundle is uploaded")  # fmt: skip
    args = p.parse_args(argv)
    if not USB_PATH.fullmatch(args.board):
        p.error(f"--board {args.board!r}: not a USB path like 1-8.4")
    stop = Interruption()
    with stop.installed(), socket.create_server((args.listen, 0)) as sock:
        if not args.no_stdin_watch:
            threading.Thread(target=_watch_stdin, args=(stop,), daemon=True).start()
        print(f"listening {sock.getsockname()[1]}", flush=True)
        Service(
            args.board, sock, stop, console=args.console, bundle_dirs=args.bundle_dir,
            upload_budget=int(args.upload_budget * 1e9),
        ).serve()  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
