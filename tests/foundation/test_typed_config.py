"""Every config reader, host and board, goes through almaboard.fields: fed non-finite,
negative, huge and wrong-typed values, each answers with a clean config error naming its
file (exit 2 on the CLI), or accepts a finite number; never a traceback, never nan/inf."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from almaboard import fields as F
from almaboard.errors import ConfigError
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support import REPO
from support_guard import BOARD_DIR  # puts tools/board and tools/guard on sys.path

for _d in (REPO / "tools" / "idlegrid", REPO / "tools" / "ota"):
    if str(_d) not in sys.path:
        sys.path.insert(0, str(_d))
assert BOARD_DIR.is_dir()

HOSTILE = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -1, -1.0, -1e300, 1e300, 10**30, -(10**30), True, False, 0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.just({}),
)


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{}"


def _guard(tmp: Path, section: str, key: str, raw: str) -> Any:
    from almaguard.config import load_guard_config

    (tmp / "guard.toml").write_text(f"[{section}]\n{key} = {raw}\n")
    cfg = load_guard_config(tmp / "guard.toml")
    return cfg.zones["tj-thermal"][key] if section.startswith("zones") else getattr(cfg, key)


def _health(tmp: Path, section: str, key: str, raw: str) -> Any:
    from almaguard.health import load_health_config

    (tmp / "health.toml").write_text(f"[{section}]\n{key} = {raw}\n")
    return load_health_config(tmp / "health.toml")[section][key]


def _fabric(tmp: Path, section: str, key: str, raw: str) -> Any:
    from almaguard.fabric import load

    link = '[[link]]\na = "n1:e1"\nb = "n2:e1"\nsubnet = "10.0.0.0/31"\n'
    line = f"{key} = {raw}\n"
    (tmp / "fabric.toml").write_text(link + line if section == "link" else "[fabric]\n" + line + link)
    return getattr(load(tmp / "fabric.toml").links[0], key)  # [fabric] mtu: every link's default


def _erangrid(tmp: Path, section: str, key: str, raw: str) -> Any:
    from erangrid.config import load

    head = f"[{section}]\n" if section else ""
    (tmp / "eran-grid.toml").write_text(head + f"{key} = {raw}\n")
    cfg = load(tmp / "eran-grid.toml")
    if section == "queue":
        return getattr(cfg.queue, key)
    return cfg.zone_max_c[key] if section == "thermal.zones" else getattr(cfg, key)


def _fleet(tmp: Path, section: str, key: str, raw: str) -> Any:
    from alma.fleet.inventory import parse_fleet

    node = '[[node]]\nname = "a1"\nrole = "board"\n'
    if section == "alert":
        text = node + f'[[alert]]\ncommand = ["x"]\n{key} = {raw}\n'
    else:
        text = f"[{section}]\n{key} = {raw}\n" + node
    fl = parse_fleet(text, tmp / "fleet.toml")
    if section == "alert":
        return getattr(fl.alerts[0], {"retries": "retries"}.get(key, f"{key}_s"))
    return getattr(fl.ssh, key) if section == "ssh" else getattr(fl, key)


READERS: dict[str, tuple[Callable[[Path, str, str, str], Any], str, list[tuple[str, str]]]] = {
    "guard": (
        _guard,
        "guard.toml",
        [
            ("guard", k)
            for k in (
                "margin_c",
                "measured_reset_c",
                "hysteresis_c",
                "interval_s",
                "state_every_s",
                "stuck_after_s",
                "holdoff_s",
                "unreadable_shed_share",
                "max_rate_c_per_s",
            )
        ]
        + [('zones."tj-thermal"', "shed_c")],
    ),  # fmt: skip
    "health": (
        _health,
        "health.toml",
        [("memory", "avail_crit_pct"), ("thermal", "stale_s"), ("storm", "long_s"), ("disk", "warn_pct")],
    ),
    "fabric": (_fabric, "fabric.toml", [("fabric", "mtu"), ("link", "speed"), ("link", "mtu")]),
    "eran-grid": (
        _erangrid,
        "eran-grid.toml",
        [("", k) for k in ("max_temp_c", "poll", "lease_ttl", "grace", "cpu_busy", "max_failures")]
        + [("thermal.zones", "tj-thermal"), ("queue", "connect_timeout")],
    ),
    "fleet": (
        _fleet,
        "fleet.toml",
        [
            ("health", "timeout"),
            ("health", "stale_after"),
            ("ssh", "connect_timeout"),
            ("alert", "timeout"),
            ("alert", "retries"),
            ("alert", "repeat"),
        ],
    ),  # fmt: skip
}
CASES = [(name, section, key) for name, (_, _, keys) in READERS.items() for section, key in keys]


@pytest.mark.parametrize(("reader", "section", "key"), CASES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=HOSTILE)
def test_every_reader_refuses_hostile_values_cleanly(
    tmp_path: Path, reader: str, section: str, key: str, value: Any
) -> None:
    read, filename, _ = READERS[reader]
    try:
        got = read(tmp_path, section, key, toml_value(value))
    except ConfigError as exc:  # refused: naming the file (and its line where the reader knows it)
        assert exc.exit_code == 2 and str(tmp_path / filename) in exc.message
        return
    # accepted: only a real, finite, not absurd number, and exactly the one written
    assert isinstance(value, int | float) and not isinstance(value, bool), (value, got)
    assert isinstance(got, int | float) and math.isfinite(got) and abs(got) <= F.HUGE, got
    assert got == value


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(key="boot", value={})  # Boot() without "seen": a TypeError escaped (found by this test)
@given(key=st.sampled_from(["started", "exit_code", "result", "phases", "boot", "board", "warnings"]), value=HOSTILE)
def test_flash_records_refuse_hostile_fields_cleanly(tmp_path: Path, key: str, value: Any) -> None:
    from alma.flash import records

    good = {
        "schema": records.SCHEMA,
        "board": {},
        "bundle_sha256": "a" * 64,
        "bundle_path": "/x",
        "machine": "m",
        "started": "2026-11-30T10:00:00Z",
        "finished": "2026-11-30T10:09:00Z",
        "result": "SUCCESS",
    }
    rec = tmp_path / "r.json"
    rec.write_text(json.dumps({**good, key: value}))
    try:
        [got] = records.load_all(tmp_path)
    except ConfigError as exc:
        assert exc.exit_code == 2 and str(rec) in exc.message
        return
    assert getattr(got, key) == value and type(getattr(got, key)) is type(value)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["wave", "result", "to_slot", "phases", "capsule", "baseline_warnings"]), value=HOSTILE)
def test_update_records_refuse_hostile_fields_cleanly(tmp_path: Path, key: str, value: Any) -> None:
    from alma.update import records

    sha = "a" * 64
    good = {
        "schema": records.SCHEMA,
        **{k: "x" for k in ("run", "swu_version", "machine")},
        "node": "b1",
        "swu_sha256": sha,
        "started": "2026-11-30T10:00:00Z",
        "result": "INTERRUPTED",
    }
    rec = records.record_path(tmp_path, sha, "b1")
    rec.parent.mkdir(parents=True, exist_ok=True)
    rec.write_text(json.dumps({**good, key: value}))
    try:
        got = records.load(rec)
    except ConfigError as exc:
        assert exc.exit_code == 2 and str(rec) in exc.message
        return
    assert getattr(got, key) == value and type(getattr(got, key)) is type(value)


@pytest.mark.parametrize(
    ("raw", "line", "why"),
    [
        (b'a = 1\nb = "x"\nc = \n', 3, "not valid TOML: Invalid value"),
        (b"a = 1\nb = caf\xe9\n", 2, "TOML file is not UTF-8 text (byte 0xe9"),
        (b"a = " + b"[" * 2000 + b"]" * 2000 + b"\n", 0, "not valid TOML: nested too deeply"),
    ],
)
def test_host_and_board_read_a_broken_toml_file_alike(tmp_path: Path, raw: bytes, line: int, why: str) -> None:
    """One reader: the host's loader and the board's layered config name the same file:line."""
    from almaboard.config import load_layers

    from alma import loader

    path = tmp_path / "guard.toml"
    path.write_bytes(raw)
    where = f"{path}:{line}: " if line else f"{path}: "
    with pytest.raises(ConfigError) as host:
        loader.load_toml(path)
    with pytest.raises(ConfigError) as board:
        load_layers(path, dropins=False)
    assert str(host.value).startswith(where + why) and str(board.value).startswith(where + why)


def test_board_config_tolerates_a_bom_as_the_host_does(tmp_path: Path) -> None:
    from almaboard.config import load_layers

    (tmp_path / "guard.toml").write_bytes(b"\xef\xbb\xbfmargin_c = 5\n")
    assert load_layers(tmp_path / "guard.toml", dropins=False).data == {"margin_c": 5}
