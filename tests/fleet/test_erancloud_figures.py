"""ERANCLOUD's figures on the panel come from the coordinator's status.json, never by hand:
live, registered and dry-run stay apart, and a hostile or broken file is a clear exit 2 with
nothing written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import REPO, run_cli

from alma.errors import ConfigError
from alma.fleet import erancloud_figures as EF

sys.path.insert(0, str(REPO / "tools" / "erancloud"))
from erancloud import status as S


def _status(tmp_path: Path, **over: object) -> Path:
    state = {"round": 7, "rounds": 30, "live_window": 3, "accuracy": [[6, 0.9387, 3]],
             "last_push": {"a": 6, "b": 5, "c": 1}}  # fmt: skip
    fig = S.figures(state, registered=4, dry_runs=2)
    fig.update(over)
    path = tmp_path / "status.json"
    S.write_atomic(path, fig)
    return path


def test_figures_from_the_coordinators_file(tmp_path: Path) -> None:
    figs = {f.label: (f.value, f.unit) for f in EF.figures(_status(tmp_path))}
    assert figs["ERANCLOUD live workers"][0] == "2"  # c's last delta is 6 rounds old: not live
    assert figs["ERANCLOUD registered workers"][0] == "4"
    assert figs["ERANCLOUD dry-run runs"] == ("2", "(not workers)")
    assert figs["ERANCLOUD round"][0] == "7 of 30"
    assert figs["ERANCLOUD test accuracy"] == ("93.9", "%")


@pytest.mark.parametrize(
    "over, why",
    [
        ({"schema": "alma.fleet-health/1"}, "is not an erancloud.status/1"),
        ({"live_workers": -1}, "live_workers"),
        ({"live_workers": True}, "live_workers"),
        ({"registered_workers": "4"}, "registered_workers"),
        ({"live_workers": 9}, "live workers but only"),
        ({"test_accuracy": 1.5}, "test_accuracy"),
        ({"test_accuracy": float("nan")}, "test_accuracy"),
        ({"dry_run_runs": 1e9}, "dry_run_runs"),
    ],
)
def test_bad_status_is_a_config_error(tmp_path: Path, over: dict[str, object], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        EF.figures(_status(tmp_path, **over))


def test_unreadable_or_not_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        EF.figures(tmp_path / "missing.json")
    (tmp_path / "x.json").write_bytes(b"\xff{")
    with pytest.raises(ConfigError, match="not JSON"):
        EF.figures(tmp_path / "x.json")


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["schema", "live_workers", "registered_workers", "dry_run_runs",
                                        "live_window", "round", "rounds", "test_accuracy"]),
                       st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)))  # fmt: skip
def test_any_file_gives_figures_or_a_config_error(data: dict[str, object]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "s.json"
        path.write_text(json.dumps({"schema": EF.SCHEMA, **data}))
        try:
            figs = EF.figures(path)
        except ConfigError:
            return
        assert len(figs) == 5 and all(f.value for f in figs)


def test_panel_publishes_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from datetime import UTC, datetime

    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[panel]\ntitle = "Lab"\n[[node]]\nname = "orin-01"\nrole = "board"\nalias = "Edge A"\n')
    snap = tmp_path / "snap.json"
    node = {"name": "orin-01", "role": "board", "alias": None, "status": "OK", "code": 0, "summary": "ok",
            "report_time": None, "checks": []}  # fmt: skip
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    snap.write_text(json.dumps({"schema": "alma.fleet-health/1", "time": now, "status": "OK", "code": 0,
                                "stale_after": 300, "nodes": [node]}))  # fmt: skip
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, "panel", "--fleet", fleet, "--snapshot", snap, "--out", out,
                           "--erancloud-status", _status(tmp_path))  # fmt: skip
    assert code == 0, err
    html = (out / "index.html").read_text()
    assert "ERANCLOUD live workers" in html and "ERANCLOUD dry-run runs" in html
    bad = _status(tmp_path, live_workers=99)
    code, _, err = run_cli(capsys, "panel", "--fleet", fleet, "--snapshot", snap, "--out", tmp_path / "o2",
                           "--erancloud-status", bad)  # fmt: skip
    assert code == 2 and not (tmp_path / "o2" / "index.html").exists()
