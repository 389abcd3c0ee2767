"""The status page people come back to: history, uptime, incidents, status.json, feed.atom,
honest freshness (also from the future), bidi-safe aliases, numeric-IP leak scan, HEAD;
real headless Chromium screenshots and an axe-core accessibility audit."""

from __future__ import annotations

import json
import os
import re
import urllib.request
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support import IN_CI
from support_fleet import AXE_JS, chromium, served

from alma.fleet import health as H
from alma.fleet import history as Hist
from alma.fleet import leaks as L
from alma.fleet import panel as P
from alma.fleet.inventory import Fleet, parse_fleet
from alma.fleet.severity import Severity
from alma.ground import utc_iso

NOW = datetime.now(UTC).replace(microsecond=0)

pytestmark = pytest.mark.usefixtures("now_per_test")  # pages are judged by the browser's clock
FLEET = """
[panel]
title = "ALMA-OS lab status"
stale_after = 600
[[panel.figure]]
label = "Boards flashed"
value = 3
[[node]]
name = "orin-01"
role = "board"
alias = "Edge A"
[[node]]
name = "orin-02"
role = "cluster"
alias = "Cluster B"
[[node]]
name = "cockpit"
role = "desktop"
alias = "Desk"
"""
ALL_CHECKS = ("storm", "memory", "gpu", "thermal", "links", "watchdog", "disk")


def node(name: str, status: str, checks: dict[str, str] | None = None, role: str = "board") -> dict[str, Any]:
    checks = {c: status for c in ALL_CHECKS} if checks is None else checks
    return {"name": name, "role": role, "alias": None, "status": status, "summary": "x", "report_time": None,
            "checks": [{"name": k, "status": v, "summary": "", "perfdata": []} for k, v in checks.items()]}  # fmt: skip


def snap(t: datetime, nodes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    nodes = nodes or [
        node("orin-01", "OK"),
        node("orin-02", "WARNING", {**{c: "OK" for c in ALL_CHECKS}, "thermal": "WARNING"}, "cluster"),
        node("cockpit", "CRITICAL", {"memory": "OK", "no-local-ai": "CRITICAL"}, "desktop"),
    ]
    return {"schema": "alma.fleet-health/1", "time": t.strftime("%Y-%m-%dT%H:%M:%SZ"), "status": "CRITICAL",
            "code": 2, "stale_after": 300, "nodes": nodes}  # fmt: skip


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return parse_fleet(FLEET, tmp_path / "fleet.toml")


# ---- panel honesty (each of these pages once showed a wrong verdict) --------------------------------


def test_future_dated_snapshot_is_stale_and_says_the_clocks_disagree(fleet: Fleet) -> None:
    html = P.render(fleet, snap(NOW + timedelta(days=30)), now=NOW)
    assert re.search(r'<div id="stale-banner" class="banner" role="alert">', html)
    assert 'class="is-stale"' in html
    assert re.search(r'<p id="stale-future">\s*<strong>Stale data: the clocks disagree.</strong>', html)
    assert re.search(r'<p id="stale-old" hidden>', html)
    # within the small skew allowance it is still fresh
    assert 'class="is-fresh"' in P.render(fleet, snap(NOW + timedelta(seconds=P.CLOCK_SKEW_S - 5)), now=NOW)


def test_old_banner_wording_is_unchanged(fleet: Fleet) -> None:
    html = P.render(fleet, snap(NOW - timedelta(hours=3)), now=NOW)
    t = (NOW - timedelta(hours=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    want = (
        f"<strong>Stale data.</strong> These states were last verified at {t}, longer ago than the\n  10 min "
        "limit. They may no longer be true: treat every node as unknown until fresh data arrives."
    )
    assert want in html and '<p id="stale-future" hidden>' in html


@pytest.mark.parametrize("alias", ["Edge 010.020.030.040", "0x0a.0x14.0x1e.0x28", "x 012.024.036.050 y", "10.0.0.001"])
def test_numeric_spellings_of_an_ip_are_refused(tmp_path: Path, alias: str) -> None:
    fl = parse_fleet(FLEET.replace('alias = "Edge A"', f'alias = "{alias}"'), tmp_path / "f.toml")
    with pytest.raises(P.LeakError, match="IP address"):
        P.render(fl, snap(NOW), now=NOW)


@pytest.mark.parametrize("text", ["v2026.11.30.1640", "1.2.3", "release 4.300.1.2", "Edge 12.5 h"])
def test_numbers_that_are_no_address_still_publish(text: str) -> None:
    assert L.find_ips(text) == []


def test_bidi_override_in_an_alias_is_isolated_and_visible(tmp_path: Path) -> None:
    fl = parse_fleet(FLEET.replace('alias = "Edge A"', 'alias = "Edge 2 \\u202elive\\u202c"'), tmp_path / "f.toml")
    html = P.render(fl, snap(NOW), now=NOW)
    assert "\u202e" not in html
    assert (
        '<th scope="row"><a href="nodes/edge-2-u-202e-live-u-202c.html">'
        "<bdi>Edge 2 &lt;U+202E&gt;live&lt;U+202C&gt;</bdi></a></th>"
    ) in html
    for alias in re.findall(r'<th scope="row"><a href="nodes/[a-z0-9-]+\.html">(.*?)</a></th>', html):
        assert alias.startswith("<bdi>") and alias.endswith("</bdi>")
    assert len(re.findall(r'<th scope="row">', html)) == len(re.findall(r'<th scope="row"><a href="nodes/', html))


def test_a_node_with_no_checks_is_grey_never_green(fleet: Fleet) -> None:
    s = snap(NOW, [node("orin-01", "OK", {}), node("orin-02", "OK", {"nas-backup01": "OK"}, "cluster")])
    view = P.build_view(fleet, s)
    assert [r.status for r in view["rows"]] == ["UNKNOWN", "UNKNOWN"]
    assert view["overall"] == "UNKNOWN"
    html = P.render(fleet, s, now=NOW)
    assert 'data-status="OK"' not in html and "nas-backup01" not in html


# ---- history, status.json, feed.atom --------------------------------------------------------


def run_at(t: datetime, statuses: dict[str, str]) -> H.FleetReport:
    nodes = [H.NodeResult(n, "board", None, Severity[s], "") for n, s in statuses.items()]
    return H.FleetReport(utc_iso(t), nodes, 300)


def test_history_uptime_is_time_weighted_and_changes_are_listed(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    t0 = NOW - timedelta(hours=4)
    for i, s in enumerate(["OK", "OK", "CRITICAL", "OK"]):  # one run per 5 min, 10 min limit
        Hist.append(db, run_at(t0 + timedelta(minutes=5 * i), {"orin-01": s, "orin-02": "OK"}))
    assert oct(db.stat().st_mode & 0o777) == "0o600"  # it names internal nodes
    h = Hist.load(db, t0 + timedelta(minutes=20), max_gap=600)
    # orin-01: OK 10 min, CRITICAL 5 min, OK 5 min (the last run holds until "now")
    assert h.nodes["orin-01"].uptime["24h"] == pytest.approx(75.0)
    assert h.nodes["orin-02"].uptime["24h"] == 100.0
    assert h.nodes["orin-01"].coverage["24h"] == pytest.approx(100 * 1200 / 86400, abs=0.1)
    changes = [(c.node, c.before, c.after) for c in h.changes]
    assert changes == [("orin-01", "CRITICAL", "OK"), ("orin-01", "OK", "CRITICAL")]
    # a gap longer than max_gap is "no data", not uptime: the last OK run holds 10 min, no more
    later = Hist.load(db, t0 + timedelta(days=2), max_gap=600)
    assert later.nodes["orin-01"].uptime["24h"] is None and later.nodes["orin-01"].uptime["7d"] == pytest.approx(80.0)


def test_a_corrupt_history_is_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    db.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(Exception, match="unreadable fleet history"):
        Hist.append(db, run_at(NOW, {"orin-01": "OK"}))


def test_a_corrupt_history_still_renders_the_page_saying_uptime_is_missing(
        fleet: Fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Before: exit 2 and no page (the served one went stale); now the states are published."""
    snap_path = tmp_path / "fleet-health.json"
    snap_path.write_text(json.dumps(snap(NOW)))
    Hist.default_history_path(snap_path).write_bytes(b"this is not sqlite" * 100)
    out = tmp_path / "out"
    P.render_to(out, fleet, snap_path, now=NOW)
    html = (out / "index.html").read_text()
    assert 'id="history-note"' in html and "fleet history could not be read" in html
    assert "unreadable fleet history" in capsys.readouterr().err


def test_render_to_writes_page_status_json_and_feed(fleet: Fleet, tmp_path: Path) -> None:
    snap_path = tmp_path / "fleet-health.json"
    db = Hist.default_history_path(snap_path)
    for i, s in enumerate(["OK", "CRITICAL", "CRITICAL", "OK", "CRITICAL"]):
        t = NOW - timedelta(minutes=5 * (4 - i))
        Hist.append(db, run_at(t, {"orin-01": "OK", "orin-02": "OK", "cockpit": s}))
    snap_path.write_text(json.dumps(snap(NOW)))
    out = tmp_path / "out"
    P.render_to(out, fleet, snap_path, now=NOW)
    want = ["feed.atom", "index.html", "status.json", "problems.html", "metrics.txt", "nodes", *P.BADGES]
    assert sorted(p.name for p in out.iterdir()) == sorted(want)
    badge = ET.fromstring((out / "badge.svg").read_text())
    assert badge.get("aria-label") == "fleet: critical" and "#cf222e" in (out / "badge.svg").read_text()
    up = (out / "badge-uptime-24h.svg").read_text()
    assert "uptime 24h: 83.33%" in up  # mean of 100, 100 and 50 % (Desk's incident)
    st = json.loads((out / "status.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert {"generated_at", "stale_after_s", "stale", "status", "nodes"} <= set(st)
    assert st["stale"] is False and st["status"] == "CRITICAL" and st["stale_after_s"] == 600
    desk = next(n for n in st["nodes"] if n["alias"] == "Desk")
    assert desk["status"] == "CRITICAL" and {"name": "no-local-ai", "status": "CRITICAL"} in desk["checks"]
    assert desk["uptime_percent"]["24h"] == pytest.approx(50.0)  # OK 5+5 min of 20 (the last run is "now")
    feed = ET.fromstring((out / "feed.atom").read_bytes())
    ns = {"a": "http://www.w3.org/2005/Atom"}
    titles = [e.findtext("a:title", namespaces=ns) for e in feed.findall("a:entry", ns)]
    assert titles == ["Desk: OK \u2192 CRITICAL", "Desk: CRITICAL \u2192 OK", "Desk: OK \u2192 CRITICAL"]
    html = (out / "index.html").read_text()
    assert '<td class="uptime" data-window="24h">50 %</td>' in html
    assert html.count("<li data-change=") == 3 and "<bdi>Desk</bdi> went from OK to" in html
    assert len(list((out / "nodes").iterdir())) == 3
    desk_page = (out / "nodes" / "desk.html").read_text()
    assert desk_page.count("<li data-change=") == 3 and 'href="../index.html"' in desk_page
    for private in ("orin-01", "orin-02", "cockpit"):
        for f in out.rglob("*"):
            assert f.is_dir() or private not in f.read_text()
    # stale data: a badge reading `status` sees UNKNOWN, the last state is kept apart
    P.render_to(out, fleet, snap_path, now=NOW + timedelta(hours=1))
    st = json.loads((out / "status.json").read_text())
    assert st["stale"] is True and st["status"] == "UNKNOWN" and st["last_known_status"] == "CRITICAL"


def test_a_leak_in_any_of_the_three_files_writes_none(tmp_path: Path) -> None:
    fl = parse_fleet(FLEET.replace('alias = "Desk"', 'alias = "Desk 192.168.7.7"'), tmp_path / "f.toml")
    snap_path = tmp_path / "s.json"
    snap_path.write_text(json.dumps(snap(NOW)))
    with pytest.raises(P.LeakError):
        P.render_to(tmp_path / "out", fl, snap_path, now=NOW)
    assert not (tmp_path / "out").exists()


def test_serve_answers_get_and_head_for_the_three_files(fleet: Fleet, tmp_path: Path) -> None:
    s = tmp_path / "s.json"
    s.write_text(json.dumps(snap(NOW)))
    out = tmp_path / "out"
    P.render_to(out, fleet, s, now=NOW)
    with served(out) as base:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        for name, ctype in (("", "text/html"), ("index.html", "text/html"), ("status.json", "application/json"),
                            ("feed.atom", "application/atom+xml")):  # fmt: skip
            body = opener.open(base + name, timeout=5).read()
            head = opener.open(urllib.request.Request(base + name, method="HEAD"), timeout=5)
            assert head.status == 200 and head.headers["Content-Type"].startswith(ctype)
            assert int(head.headers["Content-Length"]) == len(body) and head.read() == b""
        with pytest.raises(urllib.error.HTTPError) as e:
            opener.open(urllib.request.Request(base + "fleet.toml", method="HEAD"), timeout=5)
        assert e.value.code == 404


# ---- real headless Chromium: screenshots and axe-core -------------------------------------


def shots_dir(tmp_path: Path) -> Path:
    """Where screenshots go: $PANEL_SCREENSHOT_DIR to keep and look at them, else the tmp dir."""
    d = Path(os.environ.get("PANEL_SCREENSHOT_DIR") or tmp_path / "shots")
    d.mkdir(parents=True, exist_ok=True)
    return d


def thirty_nodes(tmp_path: Path) -> tuple[Fleet, dict[str, Any]]:
    body = '[panel]\ntitle = "ALMA-OS lab status"\nstale_after = 600\n'
    nodes = []
    kinds = ["OK"] * 24 + ["WARNING"] * 3 + ["CRITICAL", "UNKNOWN", "NONE"]
    for i, k in enumerate(kinds):
        body += f'[[node]]\nname = "orin-{i:02d}"\nrole = "cluster"\nalias = "Edge {i + 1}"\n'
        if k == "NONE":
            nodes.append(node(f"orin-{i:02d}", "OK", {}, "cluster"))
        else:
            nodes.append(node(f"orin-{i:02d}", k, {**{c: "OK" for c in ALL_CHECKS}, "disk": k}, "cluster"))
    return parse_fleet(body, tmp_path / "f30.toml"), snap(datetime.now(UTC).replace(microsecond=0), nodes)


def stale_node() -> dict[str, Any]:
    """A node whose last report is 27 h old: UNKNOWN, its checks stale (never green OK)."""
    n = node("orin-01", "UNKNOWN")
    for c in n["checks"]:
        c.update(status="UNKNOWN", stale=True, reported="OK")
    return n


def thousand_nodes(tmp_path: Path) -> tuple[Fleet, dict[str, Any]]:
    body = '[panel]\ntitle = "ALMA-OS fleet, 1000 nodes"\nstale_after = 600\n'
    nodes = []
    for i in range(1000):
        body += f'[[node]]\nname = "rack{i:04d}"\nrole = "cluster"\nalias = "Edge {i + 1}"\n'
        k = "CRITICAL" if i % 97 == 5 else "WARNING" if i % 41 == 3 else "OK"
        nodes.append(node(f"rack{i:04d}", k, {**{c: "OK" for c in ALL_CHECKS}, "thermal": k}, "cluster"))
    return parse_fleet(body, tmp_path / "f1000.toml"), snap(datetime.now(UTC).replace(microsecond=0), nodes)


def page_cases(fleet: Fleet, tmp_path: Path) -> dict[str, tuple[Fleet, dict[str, Any], datetime]]:
    grey = [node("orin-01", "UNKNOWN", {}), node("orin-02", "UNKNOWN", {"storm": "UNKNOWN"}, "cluster"),
            node("cockpit", "OK", {}, "desktop")]  # fmt: skip
    # "now" when the case is built, not at import: a long run must not turn "fresh" stale.
    now = datetime.now(UTC).replace(microsecond=0)
    f30, s30 = thirty_nodes(tmp_path)
    f1000, s1000 = thousand_nodes(tmp_path)
    with_stale = [stale_node(), *snap(now)["nodes"][1:]]
    return {
        "stale-node": (fleet, snap(now - timedelta(seconds=20), with_stale), now),
        "fresh": (fleet, snap(now - timedelta(seconds=20)), now),
        "stale": (fleet, snap(now - timedelta(hours=2)), now),
        "future": (fleet, snap(now + timedelta(days=30)), now),
        "all-grey": (fleet, snap(now - timedelta(seconds=20), grey), now),
        "30-nodes": (f30, s30, now),
        "1000-nodes": (f1000, s1000, now),  # last: its screenshot is the slowest
    }


def write_case(out: Path, fl: Fleet, s: dict[str, Any], now: datetime) -> Path:
    snap_path = out / "fleet-health.json"
    out.mkdir(parents=True, exist_ok=True)
    snap_path.write_text(json.dumps(s))
    db = Hist.default_history_path(snap_path)
    for h in range(24):  # a day of hourly perfdata on the first node (its page's sparklines)
        first = s["nodes"][0]["name"]
        rep = run_at(now - timedelta(hours=24 - h), {first: "OK"})
        rep.nodes[0].checks = [
            H.Check("disk", Severity.OK, perfdata=[H.Perf("root_free_pct", 70 - 0.8 * h + (h % 3), "%")]),
            H.Check("memory", Severity.OK, perfdata=[H.Perf("used_pct", 40 + 15 * ((h // 4) % 2), "%"),
                                                     H.Perf("psi_some_avg10", 0.2 * (h % 5), "")]),
        ]  # fmt: skip
        Hist.append(db, rep)
    for i in range(6):  # a little history: one incident on the first node
        statuses = {n["name"]: ("CRITICAL" if (i == 3 and j == 0) else "OK") for j, n in enumerate(s["nodes"])}
        Hist.append(db, run_at(now - timedelta(minutes=5 * (6 - i)), statuses))
    return P.render_to(out / "site", fl, snap_path, now=now)


@pytest.mark.slow
def test_chromium_screenshots_of_every_state(fleet: Fleet, tmp_path: Path) -> None:
    d = shots_dir(tmp_path)
    for name, (fl, s, now) in page_cases(fleet, tmp_path).items():
        page = write_case(tmp_path / name, fl, s, now)
        dom = chromium(tmp_path, page.as_uri(), "--dump-dom", "--virtual-time-budget=2000")
        banner = re.search(r'<div id="stale-banner"[^>]*>', dom)
        assert banner is not None
        fresh = ("fresh", "all-grey", "30-nodes", "stale-node", "1000-nodes")
        assert ("hidden" in banner.group(0)) is (name in fresh), (name, banner.group(0))
        if name == "future":
            assert re.search(r'<p id="stale-future">', dom) and re.search(r'<p id="stale-old" hidden', dom)
        if name == "all-grey":
            assert 'data-status="OK"' not in dom
        if name == "stale-node":
            first = dom.split("<bdi>Edge A</bdi>", 1)[1].split("</tr>", 1)[0]
            assert 'data-status="stale"' in first and "st-ok" not in first
        shot = d / f"panel-{name}.png"
        size = "1100,1800" if name in ("30-nodes", "1000-nodes") else "1100,900"
        chromium(tmp_path, page.as_uri(), f"--screenshot={shot}", size=size)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
        # in the dark colour scheme too
        dark = d / f"panel-{name}-dark.png"
        chromium(tmp_path, page.as_uri(), f"--screenshot={dark}", "--force-dark-mode",
                 "--blink-settings=preferredColorScheme=0", size=size)  # fmt: skip
        assert dark.read_bytes() != shot.read_bytes()
        if name == "30-nodes":  # a node page: its checks and the sparklines of its perfdata
            node_page = page.parent / "nodes" / "edge-1.html"
            assert node_page.read_text().count('<svg class="spark"') == 3
            chromium(tmp_path, node_page.as_uri(), f"--screenshot={d / 'panel-node-page.png'}", size="1100,900")
            chromium(tmp_path, node_page.as_uri(), f"--screenshot={d / 'panel-node-page-dark.png'}",
                     "--force-dark-mode", "--blink-settings=preferredColorScheme=0", size="1100,900")  # fmt: skip


AXE_PROBE = """<script>{axe}</script><script>
axe.run(document, {{resultTypes: ["violations"]}}).then(function (r) {{
  var out = r.violations.map(function (v) {{
    return {{id: v.id, impact: v.impact, nodes: v.nodes.map(function (n) {{ return n.target.join(" "); }})}};
  }});
  document.body.setAttribute("data-axe", JSON.stringify(out));
}}).catch(function (e) {{ document.body.setAttribute("data-axe-error", String(e)); }});
</script></body>"""


def axe_source() -> str:
    if AXE_JS.exists():
        return AXE_JS.read_text()
    if IN_CI:
        pytest.fail(f"{AXE_JS} missing: .ci/run must `npm install axe-core` into build/axe")
    pytest.skip("axe-core not installed (npm install --prefix build/axe axe-core)")


@pytest.mark.slow
# 1000-nodes is screenshotted, not audited: its rows are the 30-node page's rows again, and axe over
# 8000 cells needs minutes of Chromium on a loaded CI machine.
@pytest.mark.parametrize("case", ["fresh", "stale", "future", "all-grey", "30-nodes", "stale-node", "node-page"])
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_core_finds_no_serious_or_critical_violation(fleet: Fleet, tmp_path: Path, case: str, scheme: str) -> None:
    axe = axe_source()
    fl, s, now = page_cases(fleet, tmp_path)["30-nodes" if case == "node-page" else case]
    page = write_case(tmp_path / case, fl, s, now)
    if case == "node-page":
        page = page.parent / "nodes" / "edge-1.html"
    html = page.read_text()
    # A test-only copy: the page's CSP (rightly) blocks any script but its own.
    probe = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html)
    probe = probe.replace("</body>", AXE_PROBE.format(axe=axe.replace("</script", "<\\/script")))
    copy = page.with_name("axe.html")
    copy.write_text(probe)
    extra = ["--force-dark-mode", "--blink-settings=preferredColorScheme=0"] if scheme == "dark" else []
    dom = chromium(tmp_path, copy.as_uri(), "--dump-dom", "--virtual-time-budget=20000", *extra)
    m = re.search(r'data-axe="([^"]*)"', dom)
    assert m, re.findall(r'data-axe-error="[^"]*"', dom) or "axe did not finish"
    import html as html_mod

    violations = json.loads(html_mod.unescape(m.group(1)))
    bad = [v for v in violations if v["impact"] in ("serious", "critical")]
    assert bad == [], bad


@pytest.mark.slow
def test_chromium_decides_future_data_is_stale_by_itself(fleet: Fleet, tmp_path: Path) -> None:
    """Rendered by a host whose clock agreed with the data, read where the data is 30 days ahead."""
    future = datetime.now(UTC) + timedelta(days=30)
    html = P.render(fleet, snap(future), now=future)
    assert 'class="is-fresh"' in html  # fresh for the renderer
    page = tmp_path / "index.html"
    page.write_text(html)
    dom = chromium(tmp_path, page.as_uri(), "--dump-dom")
    banner = re.search(r'<div id="stale-banner"[^>]*>', dom)
    assert banner is not None and "hidden" not in banner.group(0)
    assert re.search(r'<p id="stale-future">', dom) and re.search(r'<p id="stale-old" hidden', dom)
    assert "from the future: clocks disagree" in dom and "is-stale" in dom


def test_a_host_named_like_a_status_json_key_can_still_publish(tmp_path: Path) -> None:
    fl = parse_fleet(FLEET.replace('name = "cockpit"', 'name = "schema"'), tmp_path / "f.toml")
    s = snap(NOW)
    s["nodes"][2]["name"] = "schema"
    pub = P.publish(fl, s, now=NOW)
    assert json.loads(pub.status_json)["schema"] == "alma.status/1"


def test_an_unwritable_out_dir_is_a_clear_error(fleet: Fleet, tmp_path: Path) -> None:
    s = tmp_path / "s.json"
    s.write_text(json.dumps(snap(NOW)))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(P.UserError, match="cannot write"):
        P.render_to(blocker / "site", fleet, s, now=NOW)
