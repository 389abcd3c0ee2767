"""The fleet's outputs read back by their REAL consumers (Debian packages, on loopback):
Alertmanager keeps an alert active while the node stays CRITICAL and resolves it on recovery,
one alert per node and rule; Prometheus scraping the panel's /metrics and node_exporter
reading the textfile store the CRITICAL value."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from support_prom import alertmanager, get_json, wait_until

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
