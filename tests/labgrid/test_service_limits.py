"""The flash service's limits in time and space, in-process over a socket pair (the limits are
shrunk so a test takes seconds, not the minutes the real ones allow): a peer that trickles its
request or its upload, that stalls, or that announces more than the exporter can hold, is
dropped with an error naming why, and leaves no upload behind. Nothing here reaches a board:
every case ends before the flash."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from alma.flash.interrupt import Interruption
from alma.labgrid import service

NAME = "alma-image-jetson-orin-nano-devkit.rootfs-20261130120000.tegraflash.tar.gz"


def _request(size: int) -> bytes:
    req = {"proto": service.PROTO, "op": "flash", "name": NAME, "size": size, "sha256": "0" * 64}
    return json.dumps(req).encode() + b"\n"


class Pair(NamedTuple):
    work: Path
    peer: socket.socket
    result: dict[str, Any]
    thread: threading.Thread
    config: dict[str, Any]  # Service keyword arguments, read when the thread starts


@pytest.fixture
def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pair]:
    """The service's handle() on one end of a socket pair (in a thread), the peer on the other."""
    work = tmp_path / "work"
    monkeypatch.setenv("ALMA_FLASH_WORKDIR", str(work))
    ours, peer = socket.socketpair()
    result: dict[str, Any] = {}
    config: dict[str, Any] = {}

    def serve() -> None:
        svc = service.Service("1-3", ours, Interruption(), **config)
        t0 = time.monotonic()
        try:
            svc.handle(ours)
        finally:
            result["seconds"] = time.monotonic() - t0
            ours.close()

    thread = threading.Thread(target=serve, daemon=True)
    try:
        yield Pair(work, peer, result, thread, config)
    finally:
        peer.close()
        thread.join(30)


def _answer(peer: socket.socket, reader: service.LineReader | None = None, wait: float = 30) -> dict[str, Any]:
    """The service's last message (it may close with our unread bytes: a reset, then)."""
    peer.settimeout(wait)
    reader = reader or service.LineReader(peer)
    final: dict[str, Any] | None = None
    with contextlib.suppress(ConnectionResetError):
        while (msg := reader.read()) is not None:
            final = msg
    assert final is not None
    return final


def _trickle(peer: socket.socket, data: bytes, every: float, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        for b in data:
            if stop.wait(every):
                return
            try:
                peer.sendall(bytes([b]))
            except OSError:
                return

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _uploads(work: Path) -> list[Path]:
    return list(work.glob("upload-*")) if work.exists() else []


def test_a_trickled_request_is_dropped_by_its_deadline(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "REQUEST_S", 1.0)
    stop = threading.Event()
    pair.thread.start()
    _trickle(pair.peer, _request(1000), 0.2, stop)  # one byte every 0.2 s: never idle, never done
    try:
        final = _answer(pair.peer)
    finally:
        stop.set()
    assert "did not arrive in time" in final["error"], final
    pair.thread.join(60)
    assert pair.result["seconds"] < 60  # the trickle never ends: only the 1 s deadline ends it


def test_a_trickled_upload_is_dropped_at_its_minimum_rate(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each byte arrives well within the idle limit, but the upload as a whole is far below the rate."""
    monkeypatch.setattr(service, "UPLOAD_GRACE_S", 1.0)
    monkeypatch.setattr(service, "UPLOAD_MIN_RATE", 1000)  # 2000 bytes: 3 s allowed
    stop = threading.Event()
    pair.thread.start()
    pair.peer.sendall(_request(2000))
    try:
        _trickle(pair.peer, b"x" * 2000, 0.05, stop)  # 20 bytes/s: 100 s if let run
        final = _answer(pair.peer)
    finally:
        stop.set()
    assert "upload too slow" in final["error"] and "nothing was flashed" in final["error"], final
    pair.thread.join(60)
    assert pair.result["seconds"] < 60  # far below the 100 s (or never) it would take if let run
    assert not _uploads(pair.work)


def test_a_stalled_upload_is_dropped(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "IDLE_S", 1.0)
    pair.thread.start()
    pair.peer.sendall(_request(50 << 20) + b"x" * 1000)  # then nothing, connection kept open
    final = _answer(pair.peer)
    assert "upload stalled" in final["error"], final
    pair.thread.join(60)
    assert pair.result["seconds"] < 60  # far below the 100 s (or never) it would take if let run
    assert not _uploads(pair.work)


def test_an_upload_larger_than_the_free_space_is_refused_before_a_byte(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = service.shutil.disk_usage

    def small_disk(path: Any) -> Any:
        u = real(path)
        return type(u)(u.total, u.used, 100 << 20)  # 100 MiB free

    monkeypatch.setattr(service.shutil, "disk_usage", small_disk)
    pair.thread.start()
    pair.peer.sendall(_request(1 << 30))  # 1 GiB announced
    reader = service.LineReader(pair.peer)
    assert reader.read() == {"upload": True}
    final = _answer(pair.peer, reader)
    assert "no room for the 1073741824 byte bundle" in final["error"], final
    assert not _uploads(pair.work)


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        client = socket.create_connection(srv.getsockname(), timeout=10)
        ours, _ = srv.accept()
    ours.settimeout(10)
    return ours, client


def test_a_client_gone_before_the_flash_gets_no_flash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that gave up while queued (its request already sent, then closed) is not flashed
    for: a flash nobody watches could leave the board half-written with no one told."""
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    bundle = deploy / NAME
    bundle.write_bytes(b"b" * 1000)
    flashed: list[Path] = []
    monkeypatch.setattr(service.Service, "_flash", lambda self, conn, req, b, peer: flashed.append(b))
    req = json.loads(_request(1000))
    req["path"] = str(bundle)
    line = json.dumps(req).encode() + b"\n"
    for how in ("closed", "half-closed", "connected"):
        flashed.clear()
        ours, client = _tcp_pair()
        with ours, client:
            client.sendall(line)
            if how == "closed":
                client.close()  # FIN: our "upload: false" still goes out, the flash must not
            elif how == "half-closed":
                client.shutdown(socket.SHUT_WR)  # FIN too, but it still reads: it is served
            if how != "connected":
                wait_for_eof(ours)
            service.Service("1-3", ours, Interruption(), bundle_dirs=[str(deploy)]).handle(ours)
        assert flashed == ([] if how == "closed" else [bundle]), how


def wait_for_eof(sock: socket.socket) -> None:
    """Until the peer's FIN has reached ``sock`` (its end of stream is readable)."""
    deadline = time.monotonic() + 60
    while not service._readable(sock, 0.1):
        assert time.monotonic() < deadline, "the FIN never arrived"


def test_a_half_close_and_a_close_are_told_apart_by_the_client_s_kernel() -> None:
    """Loopback, real TCP: after its upload a client sends nothing, so both end its stream.
    The probe line is acknowledged by a half-closed client (and the service can still send
    to it) and reset by a closed one (sends then fail: EPIPE/ECONNRESET); a reset without a
    FIN is a vanished client."""
    ours, client = _tcp_pair()
    with ours, client:
        assert service.peer_state(ours) == service.OPEN
        client.shutdown(socket.SHUT_WR)
        wait_for_eof(ours)
        assert service.peer_state(ours) == service.HALF_CLOSED
        service.send(ours, {"result": "still heard"})
        reader = service.LineReader(client)
        assert reader.read() == {"event": "probe"} and reader.read() == {"result": "still heard"}

    ours, client = _tcp_pair()
    with ours:
        client.close()
        wait_for_eof(ours)
        assert service.peer_state(ours) == service.CLOSED
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            for _ in range(100):  # the first send may still be taken before the reset is seen
                service.send(ours, {"result": "nobody reads this"})

    ours, client = _tcp_pair()
    with ours:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset, no FIN: the client process died with unread data
        wait_for_eof(ours)
        assert service.peer_state(ours) == service.VANISHED


@pytest.fixture
def serving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, service.Service]]:
    """The service's real accept loop on loopback (in a thread); nothing here reaches a board."""
    monkeypatch.setenv("ALMA_FLASH_WORKDIR", str(tmp_path / "work"))
    stop = Interruption()
    sock = socket.create_server(("127.0.0.1", 0))
    svc = service.Service("1-3", sock, stop)
    thread = threading.Thread(target=svc.serve, daemon=True)
    thread.start()
    try:
        yield int(sock.getsockname()[1]), svc
    finally:
        stop.cancel.set()
        thread.join(60)
        sock.close()


def _still_connected(sock: socket.socket) -> bool:
    """Neither answered (an error line) nor closed by the service: still waiting on it."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)
        return False  # data or EOF: the service has dealt with it (dropped it)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


def test_idle_peers_never_delay_the_place_holders_answer(serving: tuple[int, service.Service]) -> None:
    port, _svc = serving
    idle = [socket.create_connection(("127.0.0.1", port), timeout=120) for _ in range(2)]  # connected first
    try:
        holder = socket.create_connection(("127.0.0.1", port), timeout=120)
        with holder:
            holder.sendall(_request(1000))
            answer = service.LineReader(holder).read()
            assert answer == {"upload": True}
            # answered while both idle peers are still connected: they were not served first
            assert all(_still_connected(s) for s in idle)
    finally:
        for s in idle:
            s.close()


def test_a_second_request_is_answered_busy_at_once_while_one_uploads(serving: tuple[int, service.Service]) -> None:
    port, _svc = serving
    with socket.create_connection(("127.0.0.1", port), timeout=120) as first:
        first.sendall(_request(10 << 20))
        assert service.LineReader(first).read() == {"upload": True}
        first.sendall(b"x" * 1000)  # and then nothing: it holds the board's one flash slot
        with socket.create_connection(("127.0.0.1", port), timeout=120) as second:
            second.sendall(_request(1000))
            final = _answer(second)
            assert "busy" in final["error"] and "nothing was flashed" in final["error"], final
            assert _still_connected(first)  # the first was not dropped to serve the second


def test_an_upload_over_the_budget_is_refused_before_it_starts(pair: Pair) -> None:
    pair.thread.start()
    pair.peer.sendall(_request(64 << 30))  # 64 GiB announced
    reader = service.LineReader(pair.peer)
    pair.peer.settimeout(30)
    first = reader.read()
    assert first is not None and "upload budget" in str(first.get("error")), first
    assert not _uploads(pair.work)


def test_hostile_peers_a_trickler_and_a_huge_size_never_keep_the_place_holder_out(
    serving: tuple[int, service.Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real accept loop on loopback. A peer uploading below the minimum rate holds the one
    flash slot at most grace + size / rate; a peer naming 64 GiB is refused over the upload
    budget at once (it neither waits for the slot nor is told "busy"); the place holder asking
    after the trickler was dropped is answered."""
    monkeypatch.setattr(service, "UPLOAD_GRACE_S", 1.0)
    monkeypatch.setattr(service, "UPLOAD_MIN_RATE", 1000)  # 30000 bytes: 31 s allowed
    monkeypatch.setattr(service, "SLOT_WAIT_S", 1.0)
    port, _svc = serving
    stop = threading.Event()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as trickler:
        trickler.sendall(_request(30000))
        reader = service.LineReader(trickler)
        assert reader.read() == {"upload": True}
        _trickle(trickler, b"x" * 30000, 0.05, stop)  # 20 bytes/s: 25 min if let run
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=120) as huge:
                huge.sendall(_request(64 << 30))
                final = _answer(huge)
            assert "over the exporter's upload budget" in final["error"], final
            dropped = _answer(trickler, reader, wait=120)  # its 31 s, and more under load
            assert "upload too slow" in dropped["error"] and "nothing was flashed" in dropped["error"], dropped
        finally:
            stop.set()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as holder:
        holder.sendall(_request(1000))
        holder.settimeout(120)
        assert service.LineReader(holder).read() == {"upload": True}
