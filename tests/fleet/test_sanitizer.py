"""The one sanitizer for untrusted text (tools/board/almaboard/text.py) on every output path.

Threat model (docs/fleet.md "Hostile nodes"): a node's summary, check name, perf label or
value, an nvidia-smi process name, a kernel-log line or the guard's reason may carry
terminal escapes (OSC title/hyperlink, CSI clear-screen, BEL, CR, C1 CSI), bidi overrides,
Nagios separators (``|``, ``=``, ``'``, newline) and absurd numbers. None of it may reach a
terminal raw, split or forge a Nagios line, or print a value outside ``[-0-9.]``.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import unicodedata
from datetime import UTC, datetime
from pathlib import Path

from almaboard import text as T
from hypothesis import given, settings
from hypothesis import strategies as st
from support_guard import ALMA_HEALTH, FakeBoard, orin_zones

from alma.fleet import health as H
from alma.fleet import inspect as I
from alma.fleet import table
from alma.fleet.inventory import Node
from alma.fleet.severity import Severity
from alma.fleet.ssh import RemoteResult

REC = Path(__file__).parent / "recorded"
NOW = datetime(2026, 11, 30, 16, 0, 0, tzinfo=UTC)
HOSTILE = (
    "\x1b]0;pwned title\x07"  # OSC window title + BEL
    "\x1b[2J\x1b[H"  # CSI clear screen, cursor home
    "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\"  # OSC 8 hyperlink
    "\rOK all good"  # CR: overwrite the line
    "\x9b31m"  # C1 CSI
    "Edge 2 \u202elive\u202c"  # bidi override
    "\u2028next line"
)
PERF_ITEM = re.compile(
    r"^'[^'=|]*'=(-?[0-9.]+)(s|ms|us|%|B|KB|MB|GB|TB|c)?;([-0-9.]*:?);([-0-9.]*:?);([-0-9.]*);([-0-9.]*)$"
)


def controls(s: str) -> list[str]:
    """Characters that must never reach an output line (newline splits lines; it is not in one)."""
    return [c for c in s if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs") and c != "\n"]


def test_terminal_makes_every_escape_visible_not_silent() -> None:
    out = T.terminal(HOSTILE)
    assert controls(out) == []
    assert out.startswith("␛]0;pwned title␇␛[2J␛[H")  # visible, in place: nothing silently dropped
    assert "␍OK all good" in out and "\\x9b31m" in out and "<U+202E>live<U+202C>" in out and "<U+2028>" in out
    assert T.terminal("plain ünïcode 温度 text") == "plain ünïcode 温度 text"
    assert T.terminal(T.from_bytes(b"bad \xff\x9b utf8")) == "bad \\xff\\x9b utf8"


def hostile_report() -> H.FleetReport:
    node = Node(name="orin-01", ssh="orin-01", role="board")
    rep = {
        "schema": "alma.health/1",
        "time": "2026-11-30T16:00:00Z",
        "status": "WARNING",
        "checks": [
            {"name": "thermal\x1b[2J", "status": "WARNING", "summary": HOSTILE,
             "perfdata": [{"label": "x'|=\n\x1b]0;t\x07", "value": 1.5}]},
            {"name": "disk", "status": "OK", "summary": "ok"},  # an expected check beside it
        ],
    }  # fmt: skip
    return H.FleetReport("2026-11-30T16:00:00Z", [H.parse_report(json.dumps(rep), node, now=NOW, stale_after=300)], 300)


def test_plain_table_and_rich_table_carry_no_escape() -> None:
    rep = hostile_report()
    plain = table.plain(rep)
    assert all(controls(line) == [] for line in plain.splitlines())
    assert "␛]0;pwned title␇" in plain
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, force_terminal=True, color_system=None, width=400).print(table.rich_table(rep))
    assert "\x1b" not in buf.getvalue() and "\x07" not in buf.getvalue() and "\r" not in buf.getvalue()


def test_nagios_line_cannot_be_split_or_forged() -> None:
    line = H.nagios_line(hostile_report())
    assert "\n" not in line and controls(line) == []
    text, sep, perf = line.partition(" | ")
    assert sep and "|" not in text and "|" not in perf
    for item in perf.split(" "):
        assert PERF_ITEM.match(item), item


def test_inspect_markdown_and_json_show_process_names_harmlessly() -> None:
    answers = {c: (RemoteResult("orin-01", c, 0, []), "2026-11-30T16:00:00Z") for c in I.ALLOWED_COMMANDS}
    gpu = "4242, /usr/bin/\x1b]0;owned\x07py\x1b[2Jthon3\u202e\x9b, 1536 MiB"
    answers[I.GPU_APPS_COMMAND] = (RemoteResult("orin-01", I.GPU_APPS_COMMAND, 0, [gpu]), "2026-11-30T16:00:00Z")
    free = (REC / "free-b_procps-ng-4.0.2_debian12.txt").read_text().splitlines() + ["junk \x1b]8;;http://x\x1b\\"]
    answers[I.FREE] = (RemoteResult("orin-01", I.FREE, 0, free), "2026-11-30T16:00:00Z")
    got = I.interpret(Node("orin-01", "orin-01", "board"), answers)
    md = I.to_markdown("2026-11-30T16:00:00Z", [got])
    assert all(controls(line) == [] for line in md.splitlines())
    assert "␛]0;owned␇" in md
    js = T.dumps(I.to_json("t", [got]))
    assert controls(js) == [] and js.isascii()


# ---- property tests: arbitrary unicode and bytes --------------------------------------------

untrusted = st.one_of(st.text(), st.binary().map(T.from_bytes))
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(10**400), max_value=10**400), st.none()
)


def check_nagios_output(out: str) -> None:
    lines = out.split("\n")
    for line in lines:
        assert controls(line) == [], repr(line)
    first = lines[0]
    assert first.count("|") <= 1, first
    if "|" in first:
        for item in first.split(" | ", 1)[1].split(" "):
            m = PERF_ITEM.match(item)
            assert m, item
            assert re.fullmatch(r"[-0-9.]+", m.group(1))
    for line in lines[1:]:
        assert "|" not in line  # long output must not add forged perfdata either


@given(
    summaries=st.lists(untrusted, min_size=1, max_size=3),
    labels=st.lists(st.tuples(untrusted, numbers, numbers, numbers), max_size=4),
)
@settings(max_examples=300, deadline=None)
def test_host_outputs_never_carry_controls(
    summaries: list[str], labels: list[tuple[str, object, object, object]]
) -> None:
    node = Node(name="n1", ssh="n1", role="board")
    checks = [
        {"name": s[:20] or "c", "status": "CRITICAL", "summary": s,
         "perfdata": [{"label": lab, "value": v, "warn": w, "crit": c} for lab, v, w, c in labels]}
        for s in summaries
    ]  # fmt: skip
    doc = T.dumps({"schema": "alma.health/1", "time": "2026-11-30T16:00:00Z", "status": "OK", "checks": checks})
    node_result = H.parse_report(doc, node, now=NOW, stale_after=300)
    rep = H.FleetReport("2026-11-30T16:00:00Z", [node_result], 300)
    check_nagios_output(H.nagios_line(rep))
    for line in table.plain(rep).splitlines():
        assert controls(line) == []
    assert controls(T.dumps(rep.to_dict())) == []


@given(
    summaries=st.lists(untrusted, min_size=1, max_size=3),
    perf=st.lists(st.tuples(untrusted, numbers, numbers, numbers, st.booleans()), max_size=4),
)
@settings(max_examples=300, deadline=None)
def test_board_status_line_never_forgeable(
    summaries: list[str], perf: list[tuple[str, object, object, object, bool]]
) -> None:
    from almaboard.nagios import Check, Perf, status_line

    checks = [
        Check(s[:10] or "c", st_, s, [Perf(lab, v, "%", w, c, 0, 100, low) for lab, v, w, c, low in perf])  # type: ignore[arg-type]
        for s, st_ in zip(summaries, ["CRITICAL", "WARNING", "OK"], strict=False)
    ]
    check_nagios_output(status_line(checks))


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(10**400), max_value=10**400)))
def test_perf_number_is_plain_decimal_or_nothing(v: float | int) -> None:
    out = T.perf_number(v)
    assert out is None or re.fullmatch(r"-?[0-9]+(\.[0-9]{1,3})?", out), out


# ---- the real alma-health on a fake board: kernel-log and guard-reason injection -----------


def test_alma_health_first_line_cannot_be_forged(tmp_path: Path) -> None:
    b = FakeBoard(tmp_path / "board")
    orin_zones(b, 50.0)
    b.set_meminfo(total_kb=32_000_000, avail_kb=20_000_000)
    b.set_psi(0.0, 0.0)
    b.write_config("health.toml", "[disk]\nwarn_pct = 0.0\ncrit_pct = 0.0\n")
    b.add_kmsg("nvgpu: 17000000.gpu gk20a_fifo:1 [ERR] fault | 'forged'=1;2;3;0;9 \x1b]0;t\x07")
    b.write_guard_state(shedding=True, reason="hot\nALMA-HEALTH OK - forged | 'x'=1")
    r = subprocess.run([sys.executable, str(ALMA_HEALTH), "--root", str(b.root), "--no-save"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode in (1, 2), r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert not any(ln.startswith("ALMA-HEALTH OK") for ln in lines)
    check_nagios_output(r.stdout.rstrip("\n"))
    perf = lines[0].split(" | ", 1)[1]
    assert "'forged'" not in perf and "'x'" not in perf
    js = subprocess.run([sys.executable, str(ALMA_HEALTH), "--root", str(b.root), "--no-save", "--json"],
                        capture_output=True, text=True, timeout=60)  # fmt: skip
    json.loads(js.stdout, parse_constant=lambda c: (_ for _ in ()).throw(AssertionError(c)))
    assert Severity.parse(json.loads(js.stdout)["status"]) is not Severity.OK


def test_alma_health_usage_and_config_errors_are_unknown_on_stderr(tmp_path: Path) -> None:
    bad = tmp_path / "health.toml"
    bad.write_text("[nosuch]\nx = 1\n")
    cases = (
        (["--config", str(bad)], "unknown key(s) in the top level: nosuch"),
        (["--bogus"], "unrecognized arguments"),
    )
    for argv, needle in cases:
        r = subprocess.run([sys.executable, str(ALMA_HEALTH), "--root", str(tmp_path), *argv],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
        assert r.returncode == 3, (argv, r.returncode)
        assert needle in r.stderr and "error" in r.stderr
    r = subprocess.run([sys.executable, str(ALMA_HEALTH), "--help"], capture_output=True, text=True, timeout=60)
    assert "Usage and configuration errors" in r.stdout and "exit 3 UNKNOWN" in " ".join(r.stdout.split())
