"""A board `alma update` is rebooting or judging: `alma fleet health` and the public panel show
it as mid-update (amber, "updating"), not CRITICAL and not grey UNKNOWN; a board with no
update record keeps its real status. (The real-ssh path: test_update_e2e.py's LOST board.)"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from alma.fleet import health as H
from alma.fleet import panel as P
from alma.fleet.inventory import parse_fleet
from alma.fleet.severity import Severity
from alma.update import records as R

SHA = "ab" * 32
FLEET = """
[[node]]
name = "b1"
role = "board"
alias = "Board one"
[[node]]
name = "b2"
role = "board"
alias = "Board two"
[[node]]
name = "b3"
role = "board"
alias = "Board three"
"""


def _record(root: Path, node: str, result: str, phase: str, started: str | None = None) -> None:
    rec = R.UpdateRecord(node=node, run="r1", swu_sha256=SHA, swu_version="1.1.0", machine="m",
                         started=R.now(), result=result)  # fmt: skip
    rec.phases.append(R.Phase(phase, started or R.now()))
    R.save(root, rec)


def test_fleet_health_and_panel_show_a_mid_update_board_as_updating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    root = R.default_dir()
    _record(root, "b1", R.IN_PROGRESS, "wait")  # rebooting into the new slot: unreachable
    _record(root, "b2", R.LOST, "wait")  # did not come back in time: its health says CRITICAL
    results = [
        H.NodeResult("b1", "board", "Board one", Severity.UNKNOWN, "unreachable: connection refused",
                     reachable=False),
        H.NodeResult("b2", "board", "Board two", Severity.CRITICAL, "thermal CRITICAL",
                     checks=[H.Check("thermal", Severity.CRITICAL)]),
        H.NodeResult("b3", "board", "Board three", Severity.CRITICAL, "thermal CRITICAL",
                     checks=[H.Check("thermal", Severity.CRITICAL)]),
    ]  # fmt: skip
    H._mark_updating(results)
    by = {r.name: r for r in results}
    for n in ("b1", "b2"):
        assert by[n].status is Severity.WARNING and by[n].updating
        assert by[n].summary.startswith("mid-update: update to 1.1.0")
    assert by["b3"].status is Severity.CRITICAL and not by["b3"].updating  # no record: the truth
    snap = json.loads(H.to_json(H.FleetReport(R.now(), results, 300.0)))
    assert [n.get("updating") for n in snap["nodes"]] == [True, True, None]

    fleet = parse_fleet(FLEET, tmp_path / "fleet.toml")
    now = datetime.now(UTC)
    pub = P.publish(fleet, {**snap, "schema": H.SNAPSHOT_SCHEMA, "time": now.isoformat()}, now=now)
    status = json.loads(pub.status_json)
    rows = {n["alias"]: n for n in status["nodes"]}
    assert rows["Board one"]["status"] == "WARNING" and rows["Board one"]["updating"] is True  # not grey
    assert rows["Board two"]["status"] == "WARNING" and rows["Board two"]["updating"] is True  # not red
    assert rows["Board three"]["status"] == "CRITICAL" and "updating" not in rows["Board three"]
    assert pub.html.count("WARNING (updating)") == 2 and pub.html.count('data-updating="true"') == 2


def test_a_finished_update_no_longer_marks_the_board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    for result in (R.COMMITTED, R.ROLLED_BACK, R.FAILED):
        _record(R.default_dir(), "b1", result, "commit")
        r = H.NodeResult("b1", "board", None, Severity.CRITICAL, "thermal CRITICAL")
        H._mark_updating([r])
        assert r.status is Severity.CRITICAL and not r.updating


@pytest.mark.parametrize("hours", [13, -13])
def test_an_abandoned_update_record_does_not_mask_a_critical_board_forever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hours: int
) -> None:
    """LOST 13 h ago and never resumed (or dated 13 h ahead: a clock jump): the board's real
    status again; a fresh one (11 h) still counts as mid-update."""
    from datetime import timedelta

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    now = datetime.now(UTC)
    _record(R.default_dir(), "b1", R.LOST, "wait", started=R.utc_iso(now - timedelta(hours=hours)))
    _record(R.default_dir(), "b2", R.LOST, "wait", started=R.utc_iso(now - timedelta(hours=11)))
    rs = [H.NodeResult(n, "board", None, Severity.CRITICAL, "thermal CRITICAL") for n in ("b1", "b2")]
    H._mark_updating(rs)
    assert [(r.status, r.updating) for r in rs] == [(Severity.CRITICAL, False), (Severity.WARNING, True)]
