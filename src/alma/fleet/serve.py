"""``alma panel --serve``: a small bounded HTTP server for the rendered panel files."""

from __future__ import annotations

import contextlib
import http.server
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alma.fleet.panel import _SLUG, FILES, METRICS, NODES_DIR, PAGE

# --serve limits: a connection gets REQUEST_DEADLINE_S for the whole of its request and
# answer (one deadline: a client trickling a header line every few seconds is cut off like a
# silent one), READ_TIMEOUT_S for any one read; at most MAX_CONNECTIONS are served at once,
# at most a quarter of them to one client address; more are closed at once, never queued.
READ_TIMEOUT_S = 10.0
REQUEST_DEADLINE_S = 15.0
MAX_CONNECTIONS = 64


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves the three files, nothing else (no directory listing, no other files); GET and HEAD."""

    out_dir: Path
    timeout = READ_TIMEOUT_S  # StreamRequestHandler: socket timeout for every read and write
    request_deadline = REQUEST_DEADLINE_S

    def setup(self) -> None:
        super().setup()
        self._deadline = threading.Timer(self.request_deadline, self._expire)
        self._deadline.daemon = True
        self._deadline.start()

    def _expire(self) -> None:
        with contextlib.suppress(OSError):  # the blocked read or write fails: the thread ends
            self.connection.shutdown(socket.SHUT_RDWR)

    def finish(self) -> None:
        self._deadline.cancel()
        super().finish()

    def version_string(self) -> str:
        return "alma-panel"  # no Python or OS version for a scanner to match

    def _answer(self, with_body: bool) -> None:
        path = self.path.split("?", 1)[0]
        name = {"/": PAGE, "/metrics": METRICS}.get(path, path.lstrip("/"))
        kind = FILES.get(name)
        node_dir, _, page = name.partition("/")
        if node_dir == NODES_DIR and page.endswith(".html") and _SLUG.match(page[:-5]):
            kind = "text/html; charset=utf-8"  # nodes/<slug>.html: a fixed grammar, no traversal
        if kind is None:
            self.send_error(404)
            return
        try:
            body = (self.out_dir / name).read_bytes()
        except OSError:
            self.send_error(503, "panel not rendered yet")
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # access logs would name client addresses; keep quiet


class PanelServer(http.server.ThreadingHTTPServer):
    """A bounded server: at most ``max_connections`` handler threads; a client that hangs up
    or times out ends its thread quietly (no traceback, no client address in any log)."""

    daemon_threads = True
    max_connections = MAX_CONNECTIONS

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._per_client: dict[str, int] = {}
        self._lock = threading.Lock()

    def _take(self, host: str) -> bool:
        """A slot for ``host``, if it holds less than its share and one is free."""
        with self._lock:
            if self._per_client.get(host, 0) >= max(1, self.max_connections // 4):
                return False
            if not self._slots.acquire(blocking=False):
                return False
            self._per_client[host] = self._per_client.get(host, 0) + 1
            return True

    def _give(self, host: str) -> None:
        with self._lock:
            left = self._per_client.pop(host, 1) - 1
            if left > 0:
                self._per_client[host] = left
            self._slots.release()

    def process_request(self, request: Any, client_address: Any) -> None:
        host = str(client_address[0])
        if not self._take(host):
            self.shutdown_request(request)  # full, or this client's share: closed at once, never a thread
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._give(host)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        # ThreadingMixIn's body, with the slot given back BEFORE the socket closes: a client
        # that saw its answer end may connect again at once and find its share free.
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self._give(str(client_address[0]))
            self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):  # hang-ups, resets, read timeouts: the client's business
            return
        print(f"alma panel: request failed: {type(exc).__name__}", file=sys.stderr)


def serve(
    out_dir: Path, bind: str, port: int, interval: float, rerender: Callable[[], None],
    on_error: Callable[[Exception], None], ready: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
) -> None:  # fmt: skip
    """Serve ``out_dir/index.html`` on ``bind:port``; re-render every ``interval`` seconds.

    A failed re-render keeps the previous page (whose own banner turns stale in time).
    """
    handler = type("PanelHandler", (_Handler,), {"out_dir": out_dir})
    httpd = PanelServer((bind, port), handler)
    stop = stop or threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            try:
                rerender()
            except Exception as exc:  # keep serving the last good page
                on_error(exc)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    if ready:
        ready(f"http://{bind}:{httpd.server_address[1]}/")
    srv = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    srv.start()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        stop.set()
        httpd.shutdown()
        httpd.server_close()
