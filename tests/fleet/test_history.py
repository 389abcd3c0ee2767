"""The fleet history: a clock cannot erase it, uptime is incremental
(the same figures as the sample-by-sample definition), and a locked file is a retry, not a
loss. See the invariants in alma/fleet/history.py."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alma.errors import ConfigError
from alma.fleet import health as H
from alma.fleet import history as Hist
from alma.fleet.severity import Severity
from alma.ground import utc_iso

STATUSES = ["OK", "WARNING", "CRITICAL", "UNKNOWN"]


def run_at(t: datetime, statuses: dict[str, str]) -> H.FleetReport:
    nodes = [H.NodeResult(n, "board", None, Severity[s], "") for n, s in statuses.items()]
    return H.FleetReport(utc_iso(t), nodes, 300)


def reference_uptime(samples: list[tuple[float, str]], now: float, max_gap: float,
                     known_out: dict[str, float] | None = None) -> dict[str, float | None]:  # fmt: skip
    """The definition, sample by sample (what schema 1 computed on every render)."""
    out: dict[str, float | None] = {}
    for name, span in Hist.WINDOWS.items():
        start, ok, known = now - span, 0.0, 0.0
        for i, (t, status) in enumerate(samples):
            end = min(samples[i + 1][0] if i + 1 < len(samples) else now, t + max_gap, now)
            lo = max(t, start)
            if end > lo:
                known += end - lo
                ok += (end - lo) if status == "OK" else 0.0
        out[name] = 100.0 * ok / known if known > 0 else None
        if known_out is not None:
            known_out[name] = known
    return out


def test_a_run_far_ahead_of_the_wall_clock_erases_nothing(tmp_path: Path) -> None:
    """One run 91 days ahead pruned 1153 runs to 1."""
    db = tmp_path / "h.sqlite"
    now = datetime.now(UTC).replace(microsecond=0)
    for i in range(120):  # ten days, one run every two hours
        Hist.append(db, run_at(now - timedelta(hours=2 * (120 - i)), {"n1": "OK", "n2": "OK"}), max_gap=7200)
    with pytest.raises(ConfigError, match="ahead of this machine's clock"):
        Hist.append(db, run_at(now + timedelta(days=91), {"n1": "OK", "n2": "OK"}))
    assert Hist.load(db, now, max_gap=7200).runs == 120
    # the machine's own clock jumped too (the run is not "ahead" of it): kept, but it prunes nothing
    jumped = (now + timedelta(days=91)).timestamp()
    Hist.append(db, run_at(now + timedelta(days=91), {"n1": "OK", "n2": "OK"}), wall=lambda: jumped, max_gap=7200)
    Hist.append(db, run_at(now, {"n1": "OK", "n2": "CRITICAL"}), max_gap=7200)  # and back
    h = Hist.load(db, now, max_gap=7200)
    assert h.runs == 122
    assert h.nodes["n1"].uptime["7d"] == 100.0 and h.nodes["n1"].coverage["7d"] == 100.0


def test_pruning_keeps_the_retention_window(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    now = datetime.now(UTC)
    for days in (100, 95, 91, 89, 10):  # gaps of days: each pair is a new, unconfirmed timeline
        t = now - timedelta(days=days)
        Hist.append(db, run_at(t, {"n1": "OK"}))
        Hist.append(db, run_at(t + timedelta(minutes=1), {"n1": "OK"}))
    assert Hist.load(db, now, max_gap=900).runs == 10  # nothing pruned by a timeline of minutes
    for k in range(14):  # runs every two hours for 26 h up to now: the timeline is confirmed
        Hist.append(db, run_at(now - timedelta(hours=26 - 2 * k), {"n1": "OK"}))
        if k < 12:
            assert Hist.load(db, now, max_gap=900).runs == 11 + k, k
    # once the newest run is plausible (its timeline spans a day), what is older than 90 days
    # before it goes (the pairs at 100, 95 and 91 days), nothing else
    assert Hist.load(db, now, max_gap=900).runs == 4 + 14


def test_a_locked_history_waits_then_says_retry_never_move_it_away(tmp_path: Path) -> None:
    """Another run writing -> exit 2 advising to move the database away."""
    db = tmp_path / "h.sqlite"
    Hist.append(db, run_at(datetime.now(UTC), {"n1": "OK"}))
    holder = sqlite3.connect(db)
    holder.execute("BEGIN IMMEDIATE")  # another alma run, mid-write
    try:
        with pytest.raises(ConfigError) as err:
            Hist.append(db, run_at(datetime.now(UTC), {"n1": "OK"}), busy_timeout=0.3)
    finally:
        holder.rollback()
        holder.close()
    assert "another alma run is writing the fleet history; retry" in err.value.message
    assert "move" not in (err.value.hint or "") and "nothing was lost" in (err.value.hint or "")
    Hist.append(db, run_at(datetime.now(UTC), {"n1": "OK"}))  # once it is done, it works
    assert Hist.load(db, datetime.now(UTC), max_gap=900).runs == 2


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(1, 20_000), st.sampled_from(STATUSES)), min_size=1, max_size=40),
    tail=st.integers(0, 40_000),
)
def test_incremental_uptime_is_the_sample_by_sample_uptime(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[int, str]], tail: int
) -> None:
    db = tmp_path_factory.mktemp("h") / "h.sqlite"
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(days=40)
    t, samples = t0, []
    for gap, status in steps:
        t += timedelta(seconds=gap)
        Hist.append(db, run_at(t, {"n1": status}), max_gap=900)
        samples.append((t.timestamp(), status))
    now = t + timedelta(seconds=tail)
    got = Hist.load(db, now, max_gap=900).nodes.get("n1")
    known_s: dict[str, float] = {}
    want = reference_uptime(samples, now.timestamp(), 900, known_s)
    for name in Hist.WINDOWS:
        up = got.uptime[name] if got else None
        if want[name] is None:
            assert up is None
            continue
        assert up is not None
        # exact but for the window's first hour, which is prorated
        assert abs(up - want[name]) <= 100 * min(1.0, Hist.BUCKET_S / known_s[name]) + 0.01


def test_a_schema_1_history_is_folded_in_once(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    conn = sqlite3.connect(db)
    conn.executescript(
        "CREATE TABLE runs (id INTEGER PRIMARY KEY, epoch REAL NOT NULL, status TEXT NOT NULL);"
        "CREATE TABLE samples (run_id INTEGER NOT NULL, node TEXT NOT NULL, status TEXT NOT NULL,"
        " PRIMARY KEY (run_id, node)); PRAGMA user_version = 1;"
    )
    now = datetime.now(UTC).replace(microsecond=0)
    samples = []
    for i, s in enumerate(["OK", "OK", "CRITICAL", "OK", "OK"]):
        e = (now - timedelta(minutes=10 * (5 - i))).timestamp()
        conn.execute("INSERT INTO runs (id, epoch, status) VALUES (?, ?, ?)", (i + 1, e, s))
        conn.execute("INSERT INTO samples VALUES (?, 'n1', ?)", (i + 1, s))
        samples.append((e, s))
    conn.commit()
    conn.close()
    h = Hist.load(db, now, max_gap=900)
    assert h.runs == 5 and [(c.before, c.after) for c in h.changes] == [("CRITICAL", "OK"), ("OK", "CRITICAL")]
    assert h.nodes["n1"].uptime["24h"] == pytest.approx(reference_uptime(samples, now.timestamp(), 900)["24h"])
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == Hist.SCHEMA_VERSION


def test_a_clock_that_stays_ahead_for_several_runs_erases_nothing(tmp_path: Path) -> None:
    """The wall clock itself jumps 91 days ahead and STAYS there
    for a few runs (a bad NTP answer, a wrong RTC). The first jumped run pruned nothing, but the
    second one was a step of minutes from it, counted as plausible, and pruned all 120 real runs.
    A new timeline prunes only once it has held for CONFIRM_S of runs."""
    db = tmp_path / "h.sqlite"
    now = datetime.now(UTC).replace(microsecond=0)
    for i in range(120):
        Hist.append(db, run_at(now - timedelta(hours=2 * (120 - i)), {"n1": "OK"}), max_gap=7200)
    ahead = now + timedelta(days=91)
    for k in range(6):  # an hour of runs on the wrong clock
        t = ahead + timedelta(minutes=10 * k)
        Hist.append(db, run_at(t, {"n1": "OK"}), wall=lambda t=t: t.timestamp(), max_gap=7200)
    Hist.append(db, run_at(now, {"n1": "OK"}), max_gap=7200)  # the clock is fixed
    assert Hist.load(db, now, max_gap=7200).runs == 127
    assert Hist.load(db, now, max_gap=7200).nodes["n1"].coverage["7d"] == 100.0


def test_perfdata_is_kept_as_hourly_rollups_per_check(tmp_path: Path) -> None:
    """Per-check perfdata history (for the node pages' sparklines): hourly mean, min and max;
    stale checks and non-finite values are not stored."""
    db = tmp_path / "h.sqlite"
    now = datetime.now(UTC).replace(minute=30, second=0, microsecond=0)
    if now > datetime.now(UTC):  # half past of the current hour is still ahead: the previous one
        now -= timedelta(hours=1)
    for k in range(6):  # three hours, two runs an hour
        rep = run_at(now - timedelta(minutes=30 * (5 - k)), {"n1": "OK", "n2": "OK"})
        rep.nodes[0].checks = [H.Check("disk", Severity.OK, perfdata=[H.Perf("root_free_pct", 10.0 + k, "%"),
                                                                       H.Perf("bad", None)])]  # fmt: skip
        rep.nodes[1].checks = [H.Check("disk", Severity.UNKNOWN, stale=True, perfdata=[H.Perf("x", 1.0)])]
        Hist.append(db, rep)
    h = Hist.load(db, now, max_gap=900)
    [series] = h.perf["n1"]
    assert (series.check, series.label, series.unit) == ("disk", "root_free_pct", "%")
    assert [v for _, v in series.points] == [10.5, 12.5, 14.5] and series.last == 14.5
    assert (series.lo, series.hi) == (10.0, 15.0)
    assert "n2" not in h.perf


def test_a_full_disk_is_called_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's own "database or disk is full" (its page limit reached here, the same error a
    full disk gives) is no "unreadable fleet history" that advises moving the file away."""
    db = tmp_path / "h.sqlite"
    Hist.append(db, run_at(datetime.now(UTC), {"n1": "OK"}))
    real = sqlite3.connect

    def full(*args: object, **kw: object) -> sqlite3.Connection:
        conn = real(*args, **kw)  # type: ignore[arg-type]
        conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
        return conn

    monkeypatch.setattr(Hist.sqlite3, "connect", full)
    with pytest.raises(ConfigError) as err:
        Hist.append(db, run_at(datetime.now(UTC), {f"n{i}": "OK" for i in range(2000)}))
    assert "the disk is full" in err.value.message and "unreadable" not in err.value.message
    assert "move" not in (err.value.hint or "")


def test_a_node_inventing_labels_every_run_stays_within_its_series_budget(tmp_path: Path) -> None:
    """Before: the cap was per run, so 50 new labels a run grew the file without bound."""
    db = tmp_path / "h.sqlite"
    t0 = datetime.now(UTC) - timedelta(hours=3)
    for k in range(8):  # 8 runs x 50 invented labels = 400 series, twice the budget
        rep = run_at(t0 + timedelta(minutes=5 * k), {"n1": "OK", "n2": "OK"})
        rep.nodes[0].checks = [H.Check("disk", Severity.OK, perfdata=[H.Perf(f"l{k}_{i}", 1.0) for i in range(50)])]
        rep.nodes[1].checks = [H.Check("disk", Severity.OK, perfdata=[H.Perf("root_free_pct", 40.0 + k, "%")])]
        Hist.append(db, rep)
    with sqlite3.connect(db) as conn:
        per_node = dict(conn.execute('SELECT node, COUNT(DISTINCT "check" || label) FROM perf_rollup GROUP BY node'))
    assert per_node == {"n1": Hist.MAX_PERF_SERIES, "n2": 1}
    # the series it already has keep their history
    last = run_at(t0 + timedelta(minutes=45), {"n1": "OK"})
    last.nodes[0].checks = [H.Check("disk", Severity.OK, perfdata=[H.Perf("l0_0", 5.0), H.Perf("new", 1.0)])]
    Hist.append(db, last)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT MAX(hi) FROM perf_rollup WHERE node = 'n1' AND label = 'l0_0'").fetchone()[0] == 5.0
        assert conn.execute("SELECT COUNT(*) FROM perf_rollup WHERE label = 'new'").fetchone()[0] == 0
