"""The fleet's outputs read back by their REAL consumers (Debian packages, on loopback):
Alertmanager keeps an alert active while the node stays CRITICAL and resolves it on recovery,
one alert per node and rule; Prometheus scraping the panel's /metrics and node_exporter
reading the textfile store the CRITICAL value."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from support_prom import alertmanager, get, get_json, node_exporter, prom_query, prometheus, wait_until

from alma.fleet import alerts as A
from alma.fleet import health as H
from alma.fleet.inventory import parse_fleet
from alma.fleet.severity import Severity

pytestmark = pytest.mark.slow


def _node(name: str, status: str) -> H.NodeResult:
    return H.NodeResult(name, "board", None, Severity[status], f"{name} {status}",
                        [H.Check("disk", Severity[status], f"disk {status}")])  # fmt: skip


def _report(now: datetime, **states: str) -> H.FleetReport:
    return H.FleetReport(now.strftime("%Y-%m-%dT%H:%M:%SZ"), [_node(n, s) for n, s in states.items()], 300)


def _active(am: str, node: str) -> list[dict[str, Any]]:
    return [a for a in get_json(f"{am}/api/v2/alerts?active=true&silenced=true&inhibited=true&unprocessed=true")
            if a["labels"].get("node") == node and a["status"]["state"] == "active"]  # fmt: skip


def test_alertmanager_keeps_a_critical_node_firing_and_resolves_it_once(tmp_path: Path) -> None:
    with alertmanager(tmp_path, resolve_timeout="1s") as am:
        # The runs come every 0.5 s here; [panel] stale_after promises at most 3 s between them.
        fl = parse_fleet('[[node]]\nname = "edge-01"\nrole = "board"\n[[node]]\nname = "edge-02"\nrole = "board"\n'
                         '[panel]\nstale_after = 3\n'
                         f'[[alert]]\nname = "am"\nwebhook = "{am}/api/v2/alerts"\npayload = "alertmanager"\n'
                         'retries = 0\n', tmp_path / "fleet.toml")  # fmt: skip
        state = tmp_path / "fleet-alerts.json"
        A.fire(fl, _report(datetime.now(UTC), **{"edge-01": "WARNING", "edge-02": "OK"}), state,
               now=datetime.now(UTC), detach=False)  # fmt: skip
        first = wait_until("the WARNING alert in Alertmanager", lambda: _active(am, "edge-01"))
        assert first[0]["annotations"]["severity"] == "warning"
        t0 = time.monotonic()
        # WARNING -> CRITICAL, then CRITICAL for longer than resolve_timeout and longer than
        # the first send's endsAt (4 x 3 s): only the refreshes keep it alive.
        while time.monotonic() - t0 < 15:
            A.fire(fl, _report(datetime.now(UTC), **{"edge-01": "CRITICAL", "edge-02": "OK"}), state,
                   now=datetime.now(UTC), detach=False)  # fmt: skip
            time.sleep(0.5)
        alerts = _active(am, "edge-01")
        assert len(alerts) == 1, alerts  # one alert per node and rule, whatever its severity
        assert alerts[0]["annotations"]["severity"] == "critical"
        assert alerts[0]["labels"]["alma_rule"] == "am" and "severity" not in alerts[0]["labels"]
        assert _active(am, "edge-02") == []
        A.fire(fl, _report(datetime.now(UTC), **{"edge-01": "OK", "edge-02": "OK"}), state,
               now=datetime.now(UTC), detach=False)  # fmt: skip
        wait_until("edge-01 resolved", lambda: _active(am, "edge-01") == [])


def _two_nodes_one_alias(tmp: Path) -> Any:
    """A fleet whose two nodes end up under one public name (the loader refuses this now; a
    Fleet built around it shows what /metrics does with a collision)."""
    import dataclasses

    fl = parse_fleet('[panel]\nstale_after = 86400\n[[node]]\nname = "orin-01"\nrole = "board"\nalias = "Edge A"\n'
                     '[[node]]\nname = "orin-02"\nrole = "board"\nalias = "Edge B"\n', tmp / "fleet.toml")  # fmt: skip
    return dataclasses.replace(fl, nodes=(fl.nodes[0], dataclasses.replace(fl.nodes[1], alias="Edge A")))


def test_prometheus_scraping_the_panel_stores_the_critical_node(tmp_path: Path) -> None:
    from support_fleet import served

    from alma.fleet import panel as P

    now = datetime.now(UTC).replace(microsecond=0)
    snap = {"schema": "alma.fleet-health/1", "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "status": "CRITICAL",
            "code": 2, "stale_after": 300,
            "nodes": [{"name": n, "role": "board", "alias": None, "status": s, "summary": "", "report_time": None,
                       "checks": [{"name": "disk", "status": s, "summary": "", "perfdata": []}]}
                      for n, s in (("orin-01", "OK"), ("orin-02", "CRITICAL"))]}  # fmt: skip
    snap_path = tmp_path / "snap.json"
    snap_path.write_text(json.dumps(snap), encoding="utf-8")
    out = tmp_path / "panel"
    P.render_to(out, _two_nodes_one_alias(tmp_path), snap_path, now=now)
    with served(out) as url:
        target = url.removeprefix("http://").rstrip("/")
        with prometheus(tmp_path, [target]) as prom:
            got = wait_until("Prometheus scraped the panel",
                             lambda: prom_query(prom, 'alma_panel_node_status{node="Edge A"}'))  # fmt: skip
            assert [r["value"][1] for r in got] == ["2"]  # the CRITICAL node, not the OK one
            up = prom_query(prom, 'up{job="alma"}')
            assert [r["value"][1] for r in up] == ["1"]
            coll = wait_until("the collision counted", lambda: prom_query(
                prom, 'alma_panel_series_collisions{metric="alma_panel_node_status"}'))
            assert coll[0]["value"][1] == "1"


def test_node_exporter_reads_the_textfile_with_one_series_per_check(tmp_path: Path) -> None:
    from alma.fleet import metrics as M

    # Two check names that differ raw but not after sanitizing: "disk" + RLO vs its visible form.
    rep = H.FleetReport("2026-12-01T20:00:00Z", [H.NodeResult("edge-01", "board", None, Severity.CRITICAL, "", [
        H.Check("disk\u202e", Severity.OK, ""), H.Check("disk<U+202E>", Severity.CRITICAL, "")])], 300)  # fmt: skip
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    M.write_textfile(textdir / "alma.prom", rep)
    with node_exporter(tmp_path, textdir) as url:
        text = get(url).decode()
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert samples['alma_check_status{check="disk<U+202E>",node="edge-01",stale="false"}'] == "2"
    assert samples["node_textfile_scrape_error"] == "0"
    assert samples['alma_series_collisions{metric="alma_check_status"}'] == "1"
