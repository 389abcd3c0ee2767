"""`alma panel --serve` under hostile clients: idle connections time out, the
number of connections is bounded, a hang-up is no traceback, the Server header names no
version. A real HTTP server on loopback, raw sockets as the clients."""

from __future__ import annotations

import contextlib
import http.client
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from alma.fleet import serve as S


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    (tmp_path / "index.html").write_text("<!doctype html><title>t</title>")
    handler = type("H", (S._Handler,), {"out_dir": tmp_path, "timeout": 0.5})
    srv = type("S", (S.PanelServer,), {"max_connections": 4})(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(timeout=5)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_idle_connections_are_bounded_and_time_out(server: S.PanelServer) -> None:
    port = server.server_address[1]
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    time.sleep(0.2)  # the four are being served (each waiting for its request line)
    extra = [socket.create_connection(("127.0.0.1", port)) for _ in range(6)]
    try:
        assert all(closed_within(s, 3) for s in extra)  # over the bound: closed at once, no thread
        assert all(closed_within(s, 5) for s in idle)  # idle past the read timeout: closed
        # A slot is released just after its socket closes: the next client may race it, once.
        for _ in range(50):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                conn.request("GET", "/")
                resp = conn.getresponse()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                conn.close()
                time.sleep(0.1)
        assert resp.status == 200 and resp.getheader("Server") == "alma-panel"
        assert "Python" not in str(resp.headers)
    finally:
        for s in idle + extra:
            s.close()


def test_a_client_hang_up_prints_no_traceback(server: S.PanelServer, capsys: pytest.CaptureFixture[str]) -> None:
    for exc in (ConnectionResetError(104, "reset"), BrokenPipeError(32, "pipe"), TimeoutError("timed out")):
        try:
            raise exc
        except OSError:
            server.handle_error(None, ("127.0.0.1", 50123))
    err = capsys.readouterr().err
    assert err == "" and "Traceback" not in err and "50123" not in err
    try:
        raise ValueError("a bug")
    except ValueError:
        server.handle_error(None, ("127.0.0.1", 50123))
    err = capsys.readouterr().err
    assert "ValueError" in err and "50123" not in err and "Traceback" not in err
    assert sys.exc_info() == (None, None, None)


def _trickle(port: int, source: str, stop: threading.Event, every: float) -> socket.socket:
    """A client that sends a never-ending request header, one line every ``every`` seconds."""
    s = socket.create_connection(("127.0.0.1", port), source_address=(source, 0))
    s.sendall(b"GET / HTTP/1.1\r\n")

    def drip() -> None:
        with contextlib.suppress(OSError):
            while not stop.wait(every):
                s.sendall(b"X-Slow: 1\r\n")

    threading.Thread(target=drip, daemon=True).start()
    return s


def test_a_trickling_request_is_ended_by_one_deadline(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text("<!doctype html><title>t</title>")
    handler = type("H", (S._Handler,), {"out_dir": tmp_path, "timeout": 0.5, "request_deadline": 1.0})
    srv = S.PanelServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    stop = threading.Event()
    try:
        s = _trickle(srv.server_address[1], "127.0.0.1", stop, 0.2)  # every read well within 0.5 s
        assert closed_within(s, 60)  # generous; a per-read timeout alone never closes it
        s.close()
    finally:
        stop.set()
        srv.shutdown()
        srv.server_close()


def test_slow_clients_get_a_share_of_the_slots_and_scrapes_are_answered(server: S.PanelServer,
                                                                        tmp_path: Path) -> None:  # fmt: skip
    (tmp_path / "metrics.txt").write_text("alma_panel_stale 0\n")
    port = server.server_address[1]
    stop = threading.Event()
    slow = [_trickle(port, "127.0.0.2", stop, 0.2) for _ in range(8)]  # one address, twice the slots
    try:
        time.sleep(0.3)  # they are being served (or turned away)
        answered = 0
        for _ in range(10):  # each scrape may race the previous one's slot release, never the slow clients
            for _ in range(50):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                try:
                    conn.request("GET", "/metrics")
                    answered += conn.getresponse().status == 200
                    break
                except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                    time.sleep(0.1)
                finally:
                    conn.close()
        assert answered == 10
    finally:
        stop.set()
        for s in slow:
            s.close()
