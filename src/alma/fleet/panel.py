"""The public status panel: a static, sanitized page rendered from the last health snapshot.

Honesty rules (docs/fleet.md): every node green, red or grey (a node that reported no
check is grey, never green); the time of the data on the page; a staleness banner decided IN
THE PAGE from the embedded data time (so a page served long after it was rendered still
warns), and also at render time for readers without JS; data from the future beyond a small
clock-skew allowance is stale too ("the clocks disagree"); published figures exactly as
configured. Privacy: nodes appear only under their configured public alias (else "Node N"),
each isolated in ``<bdi>`` with its control/format characters made visible (the one
sanitizer); column headers only from the project's fixed check names, never from a report;
no check summaries (they name interfaces and peers); a final scan refuses to write a page,
status.json or feed containing an IP address (in any numeric spelling) or an internal name.

Files written (atomically, each): ``index.html``, ``problems.html`` (the same table filtered
and sorted, no JavaScript needed), ``status.json`` (current state for scripts and badges,
docs/formats.md), ``feed.atom`` (state changes from the history), SVG badges, ``metrics.txt``
(served as ``/metrics``: the public state in the Prometheus text format, aliases only) and
one ``nodes/<alias>.html`` per node (its checks, uptime, state changes and a sparkline per
perfdata series from the history). All of them pass the same leak scan (alma.fleet.leaks);
alma.fleet.serve serves them.
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import hashlib
import math
import re
import socket
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from almaboard import text as T
from jinja2 import Environment, PackageLoader, select_autoescape

from alma.errors import ConfigError, UserError
from alma.fleet.desktop import CHECK_NAME as DESKTOP_CHECK
from alma.fleet.health import KNOWN_CHECKS
from alma.fleet.history import PERF_HOURS, RESPONSE_CHECK, RESPONSE_LABEL, WINDOWS, History
from alma.fleet.inventory import ROLES, Figure, Fleet
from alma.fleet.leaks import LeakError, LeakScanner
from alma.fleet.severity import Severity, worst
from alma.ground import parse_utc, utc_iso, utc_now, write_atomic

PAGE = "index.html"
STATUS = "status.json"
FEED = "feed.atom"
BADGES = ("badge.svg", *(f"badge-uptime-{w}.svg" for w in WINDOWS))
PROBLEMS = "problems.html"
METRICS = "metrics.txt"  # served as /metrics
NODES_DIR = "nodes"
_SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
FILES = {PAGE: "text/html; charset=utf-8", PROBLEMS: "text/html; charset=utf-8", STATUS: "application/json",
         FEED: "application/atom+xml", METRICS: "text/plain; version=0.0.4; charset=utf-8",
         **dict.fromkeys(BADGES, "image/svg+xml")}  # fmt: skip
# Badge colours: the page's own (amber WARNING is not red CRITICAL), white or dark text (AA contrast).
_BADGE_COLOUR = {"OK": ("#1a7f37", "#fff"), "WARNING": ("#d4a72c", "#1f2328"), "CRITICAL": ("#cf222e", "#fff"),
                 "UNKNOWN": ("#57606a", "#fff")}  # fmt: skip
STATUS_SCHEMA = "alma.status/1"
_STATUS_KEYS = ("schema", "alma.status", "generated_at", "data_time", "stale_after_s", "stale", "stale_reason",
                "status", "last_known_status", "nodes", "alias", "role", "checks", "name", "uptime_percent",
                "figures", "label", "value", "unit", "old", "future", "feed", "entry", "title", "updated",
                "link", "href", "rel", "alternate", "author", "summary", "urn", "alma-os", "change",
                "updating")  # fmt: skip
# Data this far in the future of the reader's clock is still "now" (NTP-level skew);
# beyond it the clocks disagree and the page cannot vouch for the data's age: stale.
CLOCK_SKEW_S = 60
# The only column headers the page may show: the project's own check names.
PUBLIC_CHECKS = (*KNOWN_CHECKS, DESKTOP_CHECK)
# What each check means, in plain words, for a reader who is not an operator.
CHECK_HELP = {
    "storm": "Network storm: is the board being flooded with broadcast or multicast traffic?",
    "memory": "Memory: is there enough free memory (shared by CPU and GPU) and little memory pressure?",
    "gpu": "GPU: has the graphics processor reported driver errors or faults?",
    "thermal": "Temperature: is the board running cool enough, and is its thermal guard not having to slow work down?",
    "links": "Network links: are the expected network cables connected and running at full speed?",
    "watchdog": "Watchdog: is the hardware watchdog that restarts a hung board armed?",
    "disk": "Disk: is there enough free storage space?",
    "ota_cert": "Update certificate: will the board still accept signed updates (certificate not expired)?",
    DESKTOP_CHECK: "No local AI: the desktop that watches the fleet must not run AI training or models itself.",
}
CSS_CLASS = {
    Severity.OK: "st-ok",
    Severity.WARNING: "st-warn",  # amber: a warning is not a failure
    Severity.CRITICAL: "st-bad",
    Severity.UNKNOWN: "st-unknown",
}


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
    words: set[str] = {r.lower() for r in ROLES} | {c.lower() for c in PUBLIC_CHECKS}
    words |= {s.name.lower() for s in Severity}
    words |= {w.lower() for t in CHECK_HELP.values() for w in re.findall(r"[A-Za-z][\w.-]*", t)}
    words |= set(_STATUS_KEYS)  # status.json's and feed.atom's own words
    for name in ("panel.html.j2", "panel.css", "panel.js.j2"):
        src, _, _ = env.loader.get_source(env, name)
        words |= {w.lower() for w in re.findall(r"[A-Za-z][\w.-]*", src)}
    return words


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
    name: str = ""  # internal: joins the history; never rendered
    uptime: dict[str, str] | None = None  # window -> "99.5 %" / "no data"
    uptime_raw: dict[str, float | None] | None = None
    updating: bool = False  # mid-update (alma update), shown beside the status
    slug: str = ""  # nodes/<slug>.html, from the public label
    perf: list[Spark] = field(default_factory=list)  # public perfdata series (node page)
    perf_now: list[tuple[str, str, str, float]] = field(default_factory=list)  # (check, label, unit, value)
    coverage: dict[str, str] = field(default_factory=dict)  # window -> share of it that was checked
    checked: str = ""  # when this node's report was taken (UTC), "" when it sent none
    response: str = ""  # seconds to connect, read and judge its report this run
    response_spark: Spark | None = None  # the response time's hourly means (node page)


# Perfdata published (node pages, /metrics): only the project's checks, labels and units of
# a fixed grammar (a label is a word, not a sentence; summaries stay private), finite values.
_PUBLIC_PERF_LABEL = re.compile(r"^[A-Za-z0-9_.%-]{1,40}$")
_PUBLIC_UNITS = {"", "s", "ms", "us", "%", "B", "KB", "MB", "GB", "TB", "c"}
MAX_PUBLIC_PERF = 24  # series per node on its page and in /metrics


def _public_perf(check: Any, label: Any, unit: Any) -> bool:
    return (check in PUBLIC_CHECKS and isinstance(label, str) and bool(_PUBLIC_PERF_LABEL.match(label))
            and unit in _PUBLIC_UNITS)  # fmt: skip


@dataclass
class Spark:
    """A perfdata series on a node page: an inline SVG polyline (no script), with its range."""

    check: str
    label: str
    unit: str
    last: str
    lo: str
    hi: str
    svg_points: str
    hours: int


def _num(v: float) -> str:
    return f"{v:.4g}"


def _spark(series: Any, first_hour: int, width: int = 160, height: int = 28) -> Spark:
    span = series.hi - series.lo or 1.0
    pts = []
    for hour, v in series.points:
        x = (hour - first_hour) * width / max(1, PERF_HOURS - 1)
        y = height - 2 - (v - series.lo) * (height - 4) / span
        pts.append(f"{x:.1f},{y:.1f}")
    if len(pts) == 1:  # one hour of data: a short flat mark, not an invisible point
        x, y = pts[0].split(",")
        pts.append(f"{float(x) + 3:.1f},{y}")
    return Spark(series.check, series.label, series.unit, _num(series.last), _num(series.lo), _num(series.hi),
                 " ".join(pts), len(series.points))  # fmt: skip


def _slugs(labels: list[str]) -> list[str]:
    """File names for node pages from public labels: lower-case words joined by '-', unique."""
    out: list[str] = []
    seen: set[str] = set()
    for i, label in enumerate(labels, start=1):
        slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")[:48] or f"node-{i}"
        if slug in seen:
            slug = f"{slug}-{i}"
        seen.add(slug)
        out.append(slug)
    return out


def _checks_of(n: dict[str, Any]) -> list[dict[str, Any]]:
    raw = n.get("checks")
    return [c for c in raw if isinstance(c, dict)] if isinstance(raw, list) else []


def _uptime_words(v: float | None) -> str:
    return "no data" if v is None else f"{v:.2f} %".replace(".00 %", " %")


def _reported(node: dict[str, Any]) -> tuple[dict[Any, Severity], set[Any]]:
    """Each check's status as the node reported it (an unknown word: UNKNOWN), and the checks
    whose report is too old to vouch for them (UNKNOWN too, shown grey "stale")."""
    got: dict[Any, Severity] = {}
    stale: set[Any] = set()
    for ch in _checks_of(node):
        try:
            got[ch.get("name")] = Severity.parse(ch.get("status"))
        except ValueError:
            got[ch.get("name")] = Severity.UNKNOWN
        if ch.get("stale") is True:
            stale.add(ch.get("name"))
            got[ch.get("name")] = Severity.UNKNOWN
    return got, stale


def _cell(check: str, got: dict[Any, Severity], stale: set[Any], role: str) -> Cell:
    if check in stale:
        return Cell(check, "stale", "st-unknown")
    if check in got:
        return Cell(check, got[check].name, CSS_CLASS[got[check]])
    if check == DESKTOP_CHECK and role != "desktop":
        return Cell(check, "n/a", "st-na")  # the lab rule applies to desktops only
    return Cell(check, "not reported", "st-unknown")


def build_view(fleet: Fleet, snapshot: dict[str, Any], history: History | None = None,
               now_hour: int | None = None, forbidden: set[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Everything the template shows, already reduced to public data.

    A perfdata label that names an address or an internal name is left out (the node chose
    it: it must not be able to stop the whole page being published)."""
    scan = LeakScanner(forbidden or set())

    def public_perf(check: Any, label: Any, unit: Any) -> bool:
        # "_" joins words in a label ("orin-01_temp", "10.0.0.7_rx"): split there for the scan
        return _public_perf(check, label, unit) and not scan(re.sub(r"[_%]", " ", label))

    by_name = {n.name: n for n in fleet.nodes}
    raw_nodes = [n for n in snapshot["nodes"] if isinstance(n, dict)]
    # Only the project's own check names may become headers: a report's names are not public.
    reported = {ch.get("name") for n in raw_nodes for ch in _checks_of(n)}  # once, not per header
    checks = [c for c in PUBLIC_CHECKS if c in reported]
    rows = []
    statuses = []
    for i, n in enumerate(raw_nodes, start=1):
        cfg = by_name.get(str(n.get("name")))
        label = T.html_text(cfg.alias) if cfg and cfg.alias else f"Node {i}"
        try:
            st = Severity.parse(n.get("status"))
        except ValueError:
            st = Severity.UNKNOWN
        got, stale_checks = _reported(n)
        updating = n.get("updating") is True
        if updating:  # rebooting into a new slot or being judged: amber "updating", not red or grey
            st = Severity.WARNING if st in (Severity.CRITICAL, Severity.UNKNOWN) else st
        elif not any(name in got for name in PUBLIC_CHECKS):
            st = Severity.UNKNOWN  # nothing verified is not OK: grey, never green
        statuses.append(st)
        role = cfg.role if cfg else str(n.get("role", "node"))
        if role not in ROLES:
            role = "node"
        cells = [_cell(c, got, stale_checks, role) for c in checks]
        name = str(n.get("name"))
        h = history.nodes.get(name) if history else None
        raw_up = dict(h.uptime) if h else dict.fromkeys(WINDOWS)
        row = Row(label, role, st.name, CSS_CLASS[st], cells, name,
                  {w: _uptime_words(v) for w, v in raw_up.items()}, raw_up, updating)  # fmt: skip
        row.coverage = {w: f"{h.coverage.get(w, 0.0):g} %" for w in WINDOWS} if h else {}
        if isinstance(n.get("report_time"), str):
            with contextlib.suppress(ValueError):
                row.checked = utc_iso(parse_utc(n["report_time"]))
        dur = n.get("duration_s")
        if isinstance(dur, int | float) and not isinstance(dur, bool) and 0 <= dur < 1e6:
            row.response = f"{dur:.2f} s"
        fresh = {c for c in got if c not in stale_checks}
        for ch in _checks_of(n):
            for p in ch.get("perfdata") or [] if ch.get("name") in fresh else []:
                v = p.get("value") if isinstance(p, dict) else None
                if (isinstance(v, int | float) and not isinstance(v, bool) and v == v and abs(v) != float("inf")
                        and public_perf(ch.get("name"), p.get("label"), p.get("uom", ""))
                        and len(row.perf_now) < MAX_PUBLIC_PERF):  # fmt: skip
                    row.perf_now.append((ch["name"], p["label"], p.get("uom", ""), float(v)))
        if history:
            first_hour = (now_hour or 0) - PERF_HOURS + 1
            row.perf = [_spark(s, first_hour) for s in history.perf.get(name, [])
                        if public_perf(s.check, s.label, s.unit)][:MAX_PUBLIC_PERF]  # fmt: skip
            row.response_spark = next((_spark(s, first_hour) for s in history.perf.get(name, [])
                                       if (s.check, s.label) == (RESPONSE_CHECK, RESPONSE_LABEL)), None)  # fmt: skip
        rows.append(row)
    for r, slug in zip(rows, _slugs([r.label for r in rows]), strict=True):
        r.slug = slug
    overall = worst(statuses) if statuses else Severity.UNKNOWN
    aliases = {r.name: r.label for r in rows}

    def shown(cs: list[Any]) -> list[dict[str, Any]]:  # a node no longer in the snapshot has no public name
        return [{"alias": aliases[c.node], "time": c.time, "before": c.before, "after": c.after,
                 "css": CSS_CLASS[Severity.parse(c.after)], "node": c.node}
                for c in cs if c.node in aliases]  # fmt: skip

    changes = shown(history.changes[:20]) if history else []
    own = {n: shown(cs) for n, cs in history.node_changes.items()} if history else {}
    return {
        "rows": rows,
        "checks": checks,
        "check_help": [(c, CHECK_HELP[c]) for c in checks],
        "windows": list(WINDOWS),
        "changes": changes,
        "own_changes": own,
        "runs": history.runs if history else 0,
        "overall": overall.name,
        "overall_css": CSS_CLASS[overall],
    }


def _env() -> Environment:
    return Environment(
        loader=PackageLoader("alma.fleet", "templates"),
        autoescape=select_autoescape(["html", "j2"], default_for_string=True, default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


@dataclass
class Published:
    """The public files, already checked for leaks."""

    html: str
    status_json: str
    feed: str
    extra: dict[str, str] = field(default_factory=dict)  # badges and problems.html, by file name


def badge_svg(label: str, value: str, status: str) -> str:
    """A flat SVG badge (shields.io's layout), text only from fixed words and numbers."""
    bg, fg = _BADGE_COLOUR.get(status, _BADGE_COLOUR["UNKNOWN"])
    lw, vw = 6 * len(label) + 12, 7 * len(value) + 12
    esc = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}
    lab, val = ("".join(esc.get(c, c) for c in t) for t in (label, value))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{lw + vw}" height="20" role="img" '
        f'aria-label="{lab}: {val}"><title>{lab}: {val}</title>'
        f'<rect width="{lw}" height="20" fill="#555"/><rect x="{lw}" width="{vw}" height="20" fill="{bg}"/>'
        f'<g font-family="Verdana,DejaVu Sans,sans-serif" font-size="11" text-anchor="middle">'
        f'<text x="{lw / 2:g}" y="14" fill="#fff">{lab}</text>'
        f'<text x="{lw + vw / 2:g}" y="14" fill="{fg}">{val}</text></g></svg>\n'
    )


def badges(view: dict[str, Any], stale: bool) -> dict[str, str]:
    """badge.svg (fleet status; UNKNOWN when stale) and badge-uptime-<window>.svg (mean of the
    nodes with data; grey "no data" without history)."""
    status = "UNKNOWN" if stale else view["overall"]
    out = {"badge.svg": badge_svg("fleet", ("stale" if stale else status).lower(), status)}
    for w in WINDOWS:
        vals = [r.uptime_raw[w] for r in view["rows"] if r.uptime_raw and r.uptime_raw.get(w) is not None]
        if not vals:
            out[f"badge-uptime-{w}.svg"] = badge_svg(f"uptime {w}", "no data", "UNKNOWN")
            continue
        mean = sum(vals) / len(vals)
        colour = "OK" if mean >= 99.0 else "WARNING" if mean >= 95.0 else "CRITICAL"
        out[f"badge-uptime-{w}.svg"] = badge_svg(f"uptime {w}", f"{mean:.2f}%", colour)
    return out


def freshness(data_time: datetime, now: datetime, limit: float) -> tuple[bool, str | None, float]:
    """(stale, why, age_s): why is "old", "future" (clocks disagree) or None."""
    age = (now - data_time).total_seconds()
    if age > limit or age != age:
        return True, "old", age
    if age < -CLOCK_SKEW_S:
        return True, "future", age
    return False, None, age


def render(fleet: Fleet, snapshot: dict[str, Any], **options: Any) -> str:
    """The page's HTML (``options`` as for :func:`publish`); raises LeakError rather than leak."""
    return publish(fleet, snapshot, **options).html


def publish(
    fleet: Fleet,
    snapshot: dict[str, Any],
    *,
    stale_after: float | None = None,
    now: datetime | None = None,
    refresh_s: int | None = None,
    history: History | None = None,
    history_unreadable: bool = False,
) -> Published:
    """index.html, status.json and feed.atom; raises LeakError rather than publish a leak."""
    env = _env()
    data_time = parse_utc(snapshot["time"])
    limit = float(stale_after if stale_after is not None else fleet.panel.stale_after)
    now = now or utc_now()
    stale, why, age = freshness(data_time, now, limit)
    script = env.get_template("panel.js.j2").render()
    style = env.get_template("panel.css").render()
    forbidden = private_names(fleet, snapshot)
    view = build_view(fleet, snapshot, history, now_hour=math.floor(now.timestamp() / 3600), forbidden=forbidden)
    problems = sorted((r for r in view["rows"] if r.status != "OK"), key=lambda r: -Severity.parse(r.status).rank)
    common = dict(
        # Operator text too passes the one sanitizer: U+202E in a title reverses the page.
        title=T.html_text(fleet.panel.title),
        figures=[Figure(T.html_text(f.label), T.html_text(f.value), T.html_text(f.unit)) for f in fleet.panel.figures],
        data_iso=utc_iso(data_time),
        data_epoch=int(data_time.timestamp()),
        rendered_iso=utc_iso(now),
        stale_after=int(limit),
        skew=CLOCK_SKEW_S,
        stale_words=f"{limit / 60:g} min" if limit >= 120 else f"{limit:g} s",
        stale=stale,
        stale_why=why,
        age_s=int(age),
        script=script,
        style=style,
        csp=f"default-src 'none'; script-src '{_sha256(script)}'; style-src '{_sha256(style)}'; "
        "base-uri 'none'; form-action 'none'",
        refresh_s=refresh_s,
        n_all=len(view["rows"]),
        n_problems=len(problems),
        history_unreadable=history_unreadable,
    )
    template = env.get_template("panel.html.j2")
    html = template.render(**common, **view, page_kind="all", base="")
    # The same page, filtered and sorted without JavaScript: problems only, worst first.
    problems_html = template.render(**common, **{**view, "rows": problems}, page_kind="problems", base="")
    # Node pages are rendered with markers for the fixed script and style (scanned above, in
    # the index), scanned, then given them: 1000 pages scan ~1/3 of the bytes. A marker holds
    # "<", which autoescaping never lets through from any data.
    marks = {"script": "<alma-script/>", "style": "<alma-style/>"}
    node_pages = {}
    for r in view["rows"]:
        mine = view["own_changes"].get(r.name, [])
        node_pages[f"{NODES_DIR}/{r.slug}.html"] = template.render(
            **{**common, **marks}, **{**view, "rows": [r], "changes": mine}, node=r, page_kind="node", base="../",
            perf_hours=PERF_HOURS)  # fmt: skip
    metrics_text = public_metrics(view, data_time, stale)
    status = status_document(fleet, view, data_time=data_time, now=now, limit=limit, stale=stale, why=why)
    feed = atom_feed(fleet, view, now=now)
    badge_files = badges(view, stale)
    scan = LeakScanner(forbidden)
    found = scan(html) + scan(status) + scan(feed) + scan(problems_html) + scan(metrics_text)
    # The node pages and badges in one pass each ("\n" ends every token and address candidate).
    found += scan("\n".join(node_pages.values())) + scan("\n".join(badge_files.values()))
    if found:
        raise LeakError(
            "the panel would publish " + ", ".join(dict.fromkeys(found)) + "; nothing was written",
            hint="give the node a public alias in the fleet file, or remove the text from [panel]",
        )
    node_pages = {k: v.replace(marks["script"], script).replace(marks["style"], style) for k, v in node_pages.items()}
    return Published(html, status, feed, {**badge_files, PROBLEMS: problems_html, METRICS: metrics_text,
                                          **node_pages})  # fmt: skip


def public_metrics(view: dict[str, Any], data_time: datetime, stale: bool) -> str:
    from alma.fleet.metrics import PublicNode, public_exposition

    def code(word: str) -> int:
        return Severity[word].code if word in Severity.__members__ else 3

    nodes = [PublicNode(r.label, r.role, code(r.status), [(c.label, c.status, code(c.status)) for c in r.cells
                                                         if c.status != "n/a"],
                        dict(r.uptime_raw or {}), r.perf_now) for r in view["rows"]]  # fmt: skip
    return public_exposition(data_epoch=data_time.timestamp(), stale=stale, overall_code=code(view["overall"]),
                             nodes=nodes)  # fmt: skip


def status_document(fleet: Fleet, view: dict[str, Any], *, data_time: datetime, now: datetime, limit: float,
                    stale: bool, why: str | None) -> str:  # fmt: skip
    """status.json (docs/formats.md): current state for scripts and badges; strict JSON."""
    doc = {
        "schema": STATUS_SCHEMA,
        "generated_at": utc_iso(now),
        "data_time": utc_iso(data_time),
        "stale_after_s": limit,
        "stale": stale,
        "stale_reason": why,
        # A badge reads one field: stale data is UNKNOWN there, whatever it last said.
        "status": "UNKNOWN" if stale else view["overall"],
        "last_known_status": view["overall"],
        "nodes": [
            {
                "alias": r.label,
                "role": r.role,
                "status": r.status,
                "checks": [{"name": c.label, "status": c.status} for c in r.cells],
                "uptime_percent": r.uptime_raw,
                **({"updating": True} if r.updating else {}),
            }
            for r in view["rows"]
        ],
        "figures": [
            {"label": T.html_text(f.label), "value": T.html_text(f.value), "unit": T.html_text(f.unit)}
            for f in fleet.panel.figures
        ],  # fmt: skip
    }
    # Not ASCII-escaped: the leak scan must see names as written (aliases are already
    # sanitized, check names fixed), and UTF-8 JSON is what a badge script expects.
    # One line: json's C encoder (indent= switches to the pure-Python one: 1.9 s at 1000 nodes).
    return T.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n"


ATOM = "http://www.w3.org/2005/Atom"


def atom_feed(fleet: Fleet, view: dict[str, Any], *, now: datetime) -> str:
    """feed.atom: one entry per node state change (newest first), aliases only."""
    ET.register_namespace("", ATOM)
    feed = ET.Element(f"{{{ATOM}}}feed")

    def sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
        el = ET.SubElement(parent, f"{{{ATOM}}}{tag}", attrs)
        if text is not None:
            el.text = T.terminal(text)  # XML 1.0 forbids most controls: made visible first
        return el

    title = T.terminal(fleet.panel.title)
    sub(feed, "title", f"{title}: state changes")
    sub(feed, "id", "urn:alma-os:status:" + hashlib.sha256(title.encode()).hexdigest()[:32])
    changes = view["changes"]
    sub(feed, "updated", changes[0]["time"] if changes else utc_iso(now))
    sub(feed, "link", href=PAGE, rel="alternate")
    sub(sub(feed, "author"), "name", title)
    for c in changes:
        entry = sub(feed, "entry")
        words = f"{c['alias']}: {c['before']} \u2192 {c['after']}"
        sub(entry, "title", words)
        digest = hashlib.sha256(f"{c['alias']}|{c['time']}|{c['before']}|{c['after']}".encode()).hexdigest()[:32]
        sub(entry, "id", f"urn:alma-os:change:{digest}")
        sub(entry, "updated", c["time"])
        sub(entry, "link", href=PAGE, rel="alternate")
        sub(entry, "summary", f"{words} at {c['time']}")
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(feed, encoding="unicode") + "\n"


def write_panel(out_dir: Path, html: str | Published) -> Path:
    """Write the files (each atomically; the page last, so it never links a missing file)."""
    files = {PAGE: html} if isinstance(html, str) else {
        STATUS: html.status_json, FEED: html.feed, **html.extra, PAGE: html.html}  # fmt: skip
    for name, text in files.items():
        try:
            if "/" in name:
                (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
            # Node pages: atomic but not fsynced (re-rendered every interval; 1000 fsyncs took
            # 20+ s on a busy disk); the index, status.json, feed and badges stay durable.
            write_atomic(out_dir / name, text, durable=not name.startswith(f"{NODES_DIR}/"))
        except OSError as exc:
            raise UserError(f"cannot write {out_dir / name}: {exc.strerror or exc}",
                            hint="pick a writable --out directory") from exc  # fmt: skip
    # A node page of a node that left the snapshot (or was renamed) would keep a stale state.
    with contextlib.suppress(OSError):
        for old in (out_dir / NODES_DIR).glob("*.html"):
            if f"{NODES_DIR}/{old.name}" not in files:
                old.unlink()
    return out_dir / PAGE


def render_to(
    out_dir: Path, fleet: Fleet, snapshot_path: Path, *, stale_after: float | None = None,
    refresh_s: int | None = None, load: Callable[[Path], dict[str, Any]] | None = None,
    history_path: Path | None = None, now: datetime | None = None,
) -> Path:  # fmt: skip
    from alma.fleet import history as hist
    from alma.fleet.health import load_snapshot

    snap = (load or load_snapshot)(snapshot_path)
    when = now or utc_now()
    hpath = history_path or hist.default_history_path(snapshot_path)
    limit = float(stale_after if stale_after is not None else fleet.panel.stale_after)
    history, unreadable = None, False
    if history_path or hpath.exists():
        try:
            history = hist.load(hpath, when, max_gap=limit)
        except ConfigError as exc:  # the states are still worth publishing; the page says what is missing
            unreadable = True
            print(f"alma panel: warning: {T.terminal(exc.message)}; rendering without uptime", file=sys.stderr)
    try:
        pub = publish(fleet, snap, stale_after=stale_after, refresh_s=refresh_s, history=history, now=when,
                      history_unreadable=unreadable)  # fmt: skip
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError(f"{snapshot_path}: malformed snapshot: {exc}", hint="run `alma fleet health` again") from exc
    return write_panel(out_dir, pub)
