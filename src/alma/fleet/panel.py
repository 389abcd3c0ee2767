"""The public status panel: a static, sanitized page rendered from the last health snapshot.

Honesty rules (docs/fleet.md): every node green, red or grey; the time of the data on the
page; a staleness banner decided IN THE PAGE from the embedded data time (so a page served
long after it was rendered still warns), and also at render time for readers without JS;
published figures exactly as configured. Privacy: nodes appear only under their configured
public alias (else "Node N"); no check summaries (they name interfaces and peers); a final
scan refuses to write a page containing an IP address or an internal name (fail closed).
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import hashlib
import http.server
import ipaddress
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from alma.errors import ConfigError, UserError
from alma.fleet.desktop import CHECK_NAME as DESKTOP_CHECK
from alma.fleet.health import KNOWN_CHECKS
from alma.fleet.inventory import ROLES, Fleet
from alma.fleet.severity import Severity, worst
from alma.ground import parse_utc, utc_iso, utc_now, write_atomic

PAGE = "index.html"
_CHECK_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
# A sentence may end right after an address ("down at 10.0.0.1."): only a digit, or a dot
# followed by a digit, continues a number.
_IPV4_CAND = re.compile(r"(?<!\d)(?<!\d\.)\d{1,3}(?:\.\d{1,3}){3}(?!\d|\.\d)")
_IPV6_CAND = re.compile(r"(?<![0-9A-Za-z:])[0-9A-Fa-f:]*:[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*(?![0-9A-Za-z:])")
CSS_CLASS = {
    Severity.OK: "st-ok",
    Severity.WARNING: "st-bad",
    Severity.CRITICAL: "st-bad",
    Severity.UNKNOWN: "st-unknown",
}


class LeakError(UserError):
    """The page would publish something private; nothing was written."""


def find_ips(text: str) -> list[str]:
    """IPv4 and IPv6 addresses in ``text`` (candidates validated by ``ipaddress``)."""
    found = []
    for m in _IPV4_CAND.finditer(text):
        try:
            ipaddress.IPv4Address(m.group(0))
            found.append(m.group(0))
        except ValueError:
            pass
    for m in _IPV6_CAND.finditer(text):
        cand = m.group(0).rstrip(".")
        try:
            ipaddress.IPv6Address(cand)
            found.append(cand)
        except ValueError:
            pass
    return found


def private_names(fleet: Fleet, snapshot: dict[str, Any]) -> set[str]:
    """Internal names that must never appear: node names, ssh destinations (user and host),
    this machine's host and user name; minus the public aliases, which are meant to appear."""
    names: set[str] = set()
    for n in fleet.nodes:
        names.add(n.name)
        user, _, host = n.ssh.rpartition("@")
        names.update(x for x in (n.ssh, user, host) if x)
    for n in snapshot.get("nodes", []):
        if isinstance(n, dict) and isinstance(n.get("name"), str):
            names.add(n["name"])
    for getter in (socket.gethostname, getpass.getuser):
        with contextlib.suppress(OSError, KeyError):
            names.add(getter())
    # What the operator configured for publication is public by definition (IPs never are).
    public_text = [n.alias or "" for n in fleet.nodes] + [fleet.panel.title]
    public_text += [f"{f.label} {f.value} {f.unit}" for f in fleet.panel.figures]
    public = {n.alias for n in fleet.nodes if n.alias}
    public |= {w for t in public_text for w in re.findall(r"[\w.-]+", t)}
    # Very short tokens ("a", "pi") would match inside ordinary words; 3+ characters only.
    # The page's own fixed words ("status", "desktop", "node"...) are no secret even when a
    # host happens to be called that: without this, a desktop named "desktop" could never
    # publish a page.
    vocab = _page_vocabulary()
    return {x for x in names if len(x) >= 3 and x not in public and x.lower() not in vocab}


def _page_vocabulary() -> set[str]:
    env = _env()
    assert env.loader is not None
    words: set[str] = {r.lower() for r in ROLES} | {c.lower() for c in KNOWN_CHECKS} | {DESKTOP_CHECK}
    words |= {s.name.lower() for s in Severity}
    for name in ("panel.html.j2", "panel.css", "panel.js.j2"):
        src, _, _ = env.loader.get_source(env, name)
        words |= {w.lower() for w in re.findall(r"[A-Za-z][\w.-]*", src)}
    return words


def leaks(html: str, forbidden: set[str]) -> list[str]:
    out = [f"IP address {ip}" for ip in find_ips(html)]
    for name in sorted(forbidden):
        if re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", html, re.IGNORECASE):
            out.append(f"internal name {name!r}")
    return out


@dataclass
class Cell:
    label: str
    status: str  # OK | WARNING | CRITICAL | UNKNOWN | "not reported"
    css: str


@dataclass
class Row:
    label: str
    role: str
    status: str
    css: str
    cells: list[Cell]


def build_view(fleet: Fleet, snapshot: dict[str, Any]) -> dict[str, Any]:
    """Everything the template shows, already reduced to public data."""
    by_name = {n.name: n for n in fleet.nodes}
    raw_nodes = [n for n in snapshot["nodes"] if isinstance(n, dict)]
    checks = [c for c in KNOWN_CHECKS if any(ch.get("name") == c for n in raw_nodes for ch in n.get("checks", []))]
    for n in raw_nodes:
        for ch in n.get("checks", []):
            name = ch.get("name")
            if isinstance(name, str) and _CHECK_NAME_RE.match(name) and name not in checks:
                checks.append(name)
    rows = []
    statuses = []
    for i, n in enumerate(raw_nodes, start=1):
        cfg = by_name.get(str(n.get("name")))
        label = cfg.alias if cfg and cfg.alias else f"Node {i}"
        try:
            st = Severity.parse(n.get("status"))
        except ValueError:
            st = Severity.UNKNOWN
        statuses.append(st)
        got = {}
        for ch in n.get("checks", []):
            try:
                got[ch.get("name")] = Severity.parse(ch.get("status"))
            except ValueError:
                got[ch.get("name")] = Severity.UNKNOWN
        role = cfg.role if cfg else str(n.get("role", "node"))
        cells = []
        for c in checks:
            if c in got:
                cells.append(Cell(c, got[c].name, CSS_CLASS[got[c]]))
            elif c == DESKTOP_CHECK and role != "desktop":
                cells.append(Cell(c, "n/a", "st-na"))  # the lab rule applies to desktops only
            else:
                cells.append(Cell(c, "not reported", "st-unknown"))
        rows.append(Row(label, role, st.name, CSS_CLASS[st], cells))
    overall = worst(statuses) if statuses else Severity.UNKNOWN
    return {"rows": rows, "checks": checks, "overall": overall.name, "overall_css": CSS_CLASS[overall]}


def _env() -> Environment:
    return Environment(
        loader=PackageLoader("alma.fleet", "templates"),
        autoescape=select_autoescape(["html", "j2"], default_for_string=True, default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def render(
    fleet: Fleet,
    snapshot: dict[str, Any],
    *,
    stale_after: float | None = None,
    now: datetime | None = None,
    refresh_s: int | None = None,
) -> str:
    """The page's HTML; raises LeakError rather than return a page that leaks."""
    env = _env()
    data_time = parse_utc(snapshot["time"])
    limit = float(stale_after if stale_after is not None else fleet.panel.stale_after)
    now = now or utc_now()
    age = (now - data_time).total_seconds()
    script = env.get_template("panel.js.j2").render()
    style = env.get_template("panel.css").render()
    view = build_view(fleet, snapshot)
    html = env.get_template("panel.html.j2").render(
        title=fleet.panel.title,
        figures=fleet.panel.figures,
        data_iso=utc_iso(data_time),
        data_epoch=int(data_time.timestamp()),
        rendered_iso=utc_iso(now),
        stale_after=int(limit),
        stale_words=f"{limit / 60:g} min" if limit >= 120 else f"{limit:g} s",
        stale=not (age <= limit),
        age_s=int(age),
        script=script,
        style=style,
        csp=f"default-src 'none'; script-src '{_sha256(script)}'; style-src '{_sha256(style)}'; "
        "base-uri 'none'; form-action 'none'",
        refresh_s=refresh_s,
        **view,
    )
    found = leaks(html, private_names(fleet, snapshot))
    if found:
        raise LeakError(
            "the panel would publish " + ", ".join(found) + "; nothing was written",
            hint="give the node a public alias in the fleet file, or remove the text from [panel]",
        )
    return html


def write_panel(out_dir: Path, html: str) -> Path:
    path = out_dir / PAGE
    write_atomic(path, html)
    return path


def render_to(
    out_dir: Path, fleet: Fleet, snapshot_path: Path, *, stale_after: float | None = None,
    refresh_s: int | None = None, load: Callable[[Path], dict[str, Any]] | None = None,
) -> Path:  # fmt: skip
    from alma.fleet.health import load_snapshot

    snap = (load or load_snapshot)(snapshot_path)
    try:
        html = render(fleet, snap, stale_after=stale_after, refresh_s=refresh_s)
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError(f"{snapshot_path}: malformed snapshot: {exc}", hint="run `alma fleet health` again") from exc
    return write_panel(out_dir, html)


class _Handler(http.server.BaseHTTPRequestHandler):
    """Serves the one page, nothing else (no directory listing, no other files)."""

    page: Path

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] not in ("/", "/" + PAGE):
            self.send_error(404)
            return
        try:
            body = self.page.read_bytes()
        except OSError:
            self.send_error(503, "panel not rendered yet")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # access logs would name client addresses; keep quiet


def serve(
    out_dir: Path, bind: str, port: int, interval: float, rerender: Callable[[], None],
    on_error: Callable[[Exception], None], ready: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
) -> None:  # fmt: skip
    """Serve ``out_dir/index.html`` on ``bind:port``; re-render every ``interval`` seconds.

    A failed re-render keeps the previous page (whose own banner turns stale in time).
    """
    handler = type("PanelHandler", (_Handler,), {"page": out_dir / PAGE})
    httpd = http.server.ThreadingHTTPServer((bind, port), handler)
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
