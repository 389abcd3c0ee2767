"""The real Prometheus stack on loopback for contract tests: Alertmanager, Prometheus and
node_exporter (Debian packages), each on a free port with its storage in a tmp dir, stopped
on the way out. They cannot listen on port 0, so a free port is found by binding port 0 first."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from support import require_tool

WAIT_S = 90.0  # generous: a loaded CI host starts these slowly


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 10.0) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as r:
        return bytes(r.read())


def get_json(url: str) -> Any:
    return json.loads(get(url))


def wait_until(what: str, probe: Any, timeout: float = WAIT_S, every: float = 0.2) -> Any:
    """``probe()``'s first truthy value (exceptions count as not yet); fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            got = probe()
            if got:
                return got
            last = got
        except (OSError, ValueError) as exc:
            last = exc
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


@contextlib.contextmanager
def _running(argv: list[str], log: Path, ready_url: str) -> Iterator[None]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"{argv[0]} exited {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
            get(ready_url, timeout=2)
            return True

        wait_until(f"{argv[0]} ready", up)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def alertmanager(tmp: Path, resolve_timeout: str = "1s") -> Iterator[str]:
    """A real Alertmanager (no cluster, a receiver that sends nothing); yields its base URL."""
    binary = require_tool("prometheus-alertmanager")
    port = free_port()
    cfg = tmp / "alertmanager.yml"
    cfg.write_text(f'global:\n  resolve_timeout: {resolve_timeout}\nroute:\n  receiver: "null"\n'
                   'receivers:\n  - name: "null"\n', encoding="utf-8")  # fmt: skip
    (tmp / "am-data").mkdir()
    url = f"http://127.0.0.1:{port}"
    argv = [binary, f"--config.file={cfg}", f"--storage.path={tmp / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn"]  # fmt: skip
    with _running(argv, tmp / "alertmanager.log", f"{url}/-/ready"):
        yield url


@contextlib.contextmanager
def prometheus(tmp: Path, targets: list[str], metrics_path: str = "/metrics") -> Iterator[str]:
    """A real Prometheus scraping ``targets`` (host:port) every second; yields its base URL."""
    binary = require_tool("prometheus")
    port = free_port()
    cfg = tmp / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n"
                   f"  - job_name: alma\n    metrics_path: {metrics_path}\n    static_configs:\n"
                   f"      - targets: {json.dumps(targets)}\n", encoding="utf-8")  # fmt: skip
    (tmp / "prom-data").mkdir()
    url = f"http://127.0.0.1:{port}"
    argv = [binary, f"--config.file={cfg}", f"--storage.tsdb.path={tmp / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]  # fmt: skip
    with _running(argv, tmp / "prometheus.log", f"{url}/-/ready"):
        yield url


def prom_query(url: str, expr: str) -> list[dict[str, Any]]:
    """An instant query's result vector."""
    doc = get_json(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert doc["status"] == "success", doc
    return list(doc["data"]["result"])


@contextlib.contextmanager
def node_exporter(tmp: Path, textfile_dir: Path) -> Iterator[str]:
    """A real node_exporter with only its textfile collector on; yields its /metrics URL."""
    binary = require_tool("prometheus-node-exporter")
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    argv = [binary, "--collector.disable-defaults", "--collector.textfile",
            f"--collector.textfile.directory={textfile_dir}", f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn"]  # fmt: skip
    with _running(argv, tmp / "node_exporter.log", url):
        yield url
