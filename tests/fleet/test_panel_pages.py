"""`alma panel`'s node pages (per-check perfdata sparklines from the history) and `/metrics`
in `--serve`: served by the real panel server, parsed by the official Prometheus
parser, aliases only, and a node cannot stop the page being published with a perfdata label."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support_fleet import served

from alma.fleet import health as H
from alma.fleet import history as Hist
from alma.fleet import panel as P
from alma.fleet.inventory import Fleet, parse_fleet
from alma.fleet.severity import Severity
from alma.ground import utc_iso

FLEET = """
[panel]
title = "ALMA-OS lab status"
stale_after = 600
[[node]]
name = "orin-01"
role = "board"
alias = "Edge A"
[[node]]
name = "orin-02"
role = "board"
alias = "Edge B"
"""
PERF = [{"label": "root_free_pct", "value": 41.5, "uom": "%"}, {"label": "10.0.0.7_rx", "value": 1, "uom": "c"},
        {"label": "orin-01_temp", "value": 2, "uom": ""},
        {"label": "a sentence, with words", "value": 3, "uom": ""}]  # fmt: skip


def snap(t: datetime, disk_b: str = "WARNING") -> dict[str, Any]:
    def node(name: str, disk: str) -> dict[str, Any]:
        return {"name": name, "role": "board", "alias": None, "status": disk, "summary": "", "report_time": None,
                "checks": [{"name": "disk", "status": disk, "summary": "orin-01 10.0.0.7", "perfdata": PERF},
                           {"name": "memory", "status": "OK", "summary": "", "perfdata": []}]}  # fmt: skip

    return {"schema": "alma.fleet-health/1", "time": utc_iso(t), "status": "WARNING", "code": 1, "stale_after": 300,
            "nodes": [node("orin-01", "OK"), node("orin-02", disk_b)]}  # fmt: skip


def history(db: Path, now: datetime) -> None:
    for k in range(12):  # six hours, a run every 30 min; free space falling on orin-01
        rep = H.FleetReport(utc_iso(now - timedelta(minutes=30 * (11 - k))), [
            H.NodeResult("orin-01", "board", None, Severity.OK, "", checks=[
                H.Check("disk", Severity.OK, perfdata=[H.Perf("root_free_pct", 60.0 - k, "%"),
                                                       H.Perf("10.0.0.7_rx", 5.0, "c")])]),
            H.NodeResult("orin-02", "board", None, Severity.WARNING, "")], 300)  # fmt: skip
        Hist.append(db, rep)


@pytest.fixture
def site(tmp_path: Path) -> tuple[Path, Fleet, Path]:
    now = datetime.now(UTC).replace(microsecond=0)
    snap_path = tmp_path / "fleet-health.json"
    snap_path.write_text(json.dumps(snap(now)))
    history(Hist.default_history_path(snap_path), now)
    fl = parse_fleet(FLEET, tmp_path / "fleet.toml")
    out = tmp_path / "site"
    P.render_to(out, fl, snap_path, now=now)
    return out, fl, snap_path


def test_node_page_has_a_sparkline_per_perfdata_series_and_no_private_text(site: tuple[Path, Fleet, Path]) -> None:
    out, _, snap_path = site
    assert sorted(p.name for p in (out / "nodes").iterdir()) == ["edge-a.html", "edge-b.html"]
    page = (out / "nodes" / "edge-a.html").read_text()
    assert "<title>Edge A · ALMA-OS lab status</title>" in page
    [svg] = re.findall(r'<svg class="spark"[^>]*>.*?</svg>', page)
    now = datetime.fromisoformat(json.loads(snap_path.read_text())["time"].replace("Z", "+00:00"))
    hours = len({int((now - timedelta(minutes=30 * (11 - k))).timestamp()) // 3600 for k in range(12)})  # 6 or 7
    assert f'aria-label="root_free_pct, {hours} hourly means from' in svg
    points = re.search(r'points="([^"]+)"', svg)
    assert points is not None and len(points.group(1).split()) == hours  # one mean per hour
    ys = [float(p.split(",")[1]) for p in points.group(1).split()]
    assert ys == sorted(ys)  # free space fell: the line goes down (SVG y grows downwards)
    # perfdata labels naming an address or a node, and sentences, are never published
    for f in out.rglob("*"):
        if f.is_file():
            text = f.read_text()
            assert "10.0.0.7" not in text and "orin-0" not in text and "a sentence" not in text, f
    assert 'href="nodes/edge-a.html"' in (out / "index.html").read_text()


def test_a_removed_node_loses_its_page(site: tuple[Path, Fleet, Path]) -> None:
    out, fl, snap_path = site
    s = json.loads(snap_path.read_text())
    s["nodes"] = s["nodes"][:1]
    snap_path.write_text(json.dumps(s))
    P.render_to(out, fl, snap_path)
    assert sorted(p.name for p in (out / "nodes").iterdir()) == ["edge-a.html"]


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, "", ""


def test_serve_answers_metrics_and_node_pages_parsed_by_the_prometheus_parser(site: tuple[Path, Fleet, Path]) -> None:
    out, _, _ = site
    with served(out) as base:
        code, ctype, body = get(base + "metrics")
        assert code == 200 and ctype.startswith("text/plain; version=0.0.4")
        fams = {f.name: f for f in text_string_to_metric_families(body)}
        nodes = {s.labels["node"]: s.value for s in fams["alma_panel_node_status"].samples}
        assert nodes == {"Edge A": 0.0, "Edge B": 1.0}
        checks = {(s.labels["node"], s.labels["check"]): (s.labels["state"], s.value)
                  for s in fams["alma_panel_check_status"].samples}  # fmt: skip
        assert checks[("Edge B", "disk")] == ("WARNING", 1.0)
        perf = [(s.labels["node"], s.labels["label"], s.labels["unit"], s.value)
                for s in fams["alma_panel_perfdata"].samples]  # fmt: skip
        assert perf == [("Edge A", "root_free_pct", "%", 41.5), ("Edge B", "root_free_pct", "%", 41.5)]
        up = {(s.labels["node"], s.labels["window"]) for s in fams["alma_panel_uptime_ratio"].samples}
        assert ("Edge A", "24h") in up
        assert fams["alma_panel_stale"].samples[0].value == 0.0
        code, ctype, page = get(base + "nodes/edge-a.html")
        assert code == 200 and ctype.startswith("text/html") and '<svg class="spark"' in page
        for bad in ("nodes/../status.json", "nodes/%2e%2e/index.html", "nodes/Edge-A.html", "nodes/", "metrics.prom"):
            assert get(base + bad)[0] == 404, bad


def test_metrics_of_stale_data_say_unknown(tmp_path: Path) -> None:
    fl = parse_fleet(FLEET, tmp_path / "fleet.toml")
    now = datetime.now(UTC).replace(microsecond=0)
    pub = P.publish(fl, snap(now - timedelta(hours=2)), now=now)
    fams = {f.name: f for f in text_string_to_metric_families(pub.extra[P.METRICS])}
    assert fams["alma_panel_stale"].samples[0].value == 1.0
    assert {s.value for s in fams["alma_panel_node_status"].samples} == {3.0}
    assert {s.value for s in fams["alma_panel_check_status"].samples} == {3.0}


def test_a_node_page_shows_its_own_changes_however_busy_the_fleet_is(tmp_path: Path) -> None:
    """Before: node pages filtered the fleet's newest 20 changes, so a node whose one change
    was followed by 30 of another node's read "No state change recorded"."""
    now = datetime.now(UTC).replace(microsecond=0)
    snap_path = tmp_path / "fleet-health.json"
    snap_path.write_text(json.dumps(snap(now)))
    db = Hist.default_history_path(snap_path)
    start = now - timedelta(hours=10)
    for k in range(40):  # orin-01 fails once at the start; orin-02 flaps all the time after
        t = start + timedelta(minutes=10 * k)
        a = "CRITICAL" if k == 1 else "OK"
        b = "WARNING" if k % 2 else "OK"
        Hist.append(db, H.FleetReport(utc_iso(t), [H.NodeResult("orin-01", "board", None, Severity[a], "",
                                                                 duration_s=0.25 + k / 100),
                                                   H.NodeResult("orin-02", "board", None, Severity[b], "")], 300))
    out = tmp_path / "site"
    P.render_to(out, parse_fleet(FLEET, tmp_path / "fleet.toml"), snap_path, now=now)
    page = (out / "nodes" / "edge-a.html").read_text()
    assert "No state change recorded" not in page
    assert page.count('data-change="CRITICAL"') == 1 and page.count('data-change="OK"') == 1
    assert "Edge B" not in re.search(r'<ol class="changes">.*?</ol>', page, re.S).group(0)  # type: ignore[union-attr]
    # labels that say what a number is, and how much of each window the uptime stands on
    assert "mean of the last hour" in page and ">value<" not in page
    assert re.search(r"24h: [\d.]+ % over [\d.]+ % of the 24h checked", page)
    assert 'id="last-check"' in page
    assert 'id="response-history"' in page and 'aria-label="response time, ' in page  # stored and drawn
