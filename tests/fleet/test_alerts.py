"""Alerts and metrics (operator features): state-change alerts with repeat and
maintenance windows, delivered by a detached deliverer to a REAL local HTTP receiver that
fails twice (retries with backoff) and to a command hook; Prometheus output checked by the
official prometheus_client parser."""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from alma.errors import ConfigError
from alma.fleet import alerts as A
from alma.fleet import health as H
from alma.fleet import metrics as M
from alma.fleet.inventory import parse_fleet
from alma.fleet.severity import Severity

NOW = datetime(2026, 12, 1, 20, 0, 0, tzinfo=UTC)


def node(name: str, status: str, checks: dict[str, str]) -> H.NodeResult:
    cs = [H.Check(c, Severity[s], f"{c} is {s}") for c, s in checks.items()]
    return H.NodeResult(name, "board", None, Severity[status], f"{name} {status}", cs)


def report(*nodes: H.NodeResult) -> H.FleetReport:
    return H.FleetReport("2026-12-01T20:00:00Z", list(nodes), 300)


def fleet(tmp: Path, alert: str) -> Any:
    return parse_fleet('[[node]]\nname = "edge-01"\nrole = "board"\n[[node]]\nname = "edge-02"\nrole = "board"\n'
                       + alert, tmp / "fleet.toml")  # fmt: skip


def test_state_changes_fire_repeat_and_resolve(tmp_path: Path) -> None:
    fl = fleet(tmp_path, '[[alert]]\nname = "ops"\nrepeat = 600\ncommand = ["true"]\n')
    crit = report(node("edge-01", "CRITICAL", {"disk": "CRITICAL", "thermal": "OK"}),
                  node("edge-02", "OK", {"disk": "OK"}))  # fmt: skip
    events, state = A.evaluate(fl.alerts, crit, {}, NOW)
    assert [(e["node"], e["kind"], e["previous"], e["status"]) for _, e in events] == [
        ("edge-01", "changed", "OK", "CRITICAL")]  # fmt: skip
    assert events[0][1]["checks"] == [{"name": "disk", "status": "CRITICAL"}]
    again, state = A.evaluate(fl.alerts, crit, state, NOW + timedelta(seconds=60))
    assert again == []  # same state, repeat not due
    later, state = A.evaluate(fl.alerts, crit, state, NOW + timedelta(seconds=700))
    assert [e["kind"] for _, e in later] == ["repeat"]
    ok = report(node("edge-01", "OK", {"disk": "OK"}), node("edge-02", "OK", {"disk": "OK"}))
    back, _ = A.evaluate(fl.alerts, ok, state, NOW + timedelta(seconds=800))
    assert [(e["node"], e["status"], e["previous"]) for _, e in back] == [("edge-01", "OK", "CRITICAL")]
    am = A.alertmanager_payload(back[0][1])[0]
    assert am["endsAt"] == am["startsAt"] and am["annotations"]["severity"] == "critical"  # resolves the alert


def test_alertmanager_alerts_carry_ends_at_and_are_refreshed_before_it(tmp_path: Path) -> None:
    fl = fleet(tmp_path, '[[alert]]\nname = "am"\nwebhook = "http://127.0.0.1:9/api/v2/alerts"\n'
                         'payload = "alertmanager"\n')  # fmt: skip
    warn = report(node("edge-01", "WARNING", {"disk": "WARNING"}), node("edge-02", "OK", {"disk": "OK"}))
    crit = report(node("edge-01", "CRITICAL", {"disk": "CRITICAL"}), node("edge-02", "OK", {"disk": "OK"}))
    ev, state = A.evaluate(fl.alerts, warn, {}, NOW, run_every_s=300)
    am = A.alertmanager_payload(ev[0][1])[0]
    assert am["endsAt"] == "2026-12-01T20:20:00Z" and "severity" not in am["labels"]  # 4 x 300 s ahead
    ev, state = A.evaluate(fl.alerts, crit, state, NOW + timedelta(seconds=60), run_every_s=300)
    am2 = A.alertmanager_payload(ev[0][1])[0]
    assert am2["labels"] == am["labels"] and am2["annotations"]["severity"] == "critical"  # the same alert
    assert am2["startsAt"] == am["startsAt"]  # firing since the first problem
    quiet, state = A.evaluate(fl.alerts, crit, state, NOW + timedelta(seconds=600), run_every_s=300)
    assert quiet == []  # refreshed 2 x 300 s after the last send, not before
    ev, state = A.evaluate(fl.alerts, crit, state, NOW + timedelta(seconds=660), run_every_s=300)
    assert [e["kind"] for _, e in ev] == ["refresh"]
    assert A.alertmanager_payload(ev[0][1])[0]["endsAt"] == "2026-12-01T20:31:00Z"


def test_maintenance_windows_per_node_and_per_check(tmp_path: Path) -> None:
    fl = fleet(tmp_path, '[[alert]]\nname = "ops"\ncommand = ["true"]\n'
               '[[alert.maintenance]]\nnode = "edge-01"\nstart = "2026-12-01T19:00:00Z"\nend = "2026-12-01T21:00:00Z"\n'
               '[[alert.maintenance]]\nnode = "*"\ncheck = "disk"\nstart = "2026-12-01T19:00:00Z"\n'
               'end = "2026-12-01T21:00:00Z"\n')  # fmt: skip
    bad = report(node("edge-01", "CRITICAL", {"thermal": "CRITICAL"}),
                 node("edge-02", "WARNING", {"disk": "WARNING", "thermal": "OK"}))  # fmt: skip
    events, state = A.evaluate(fl.alerts, bad, {}, NOW)
    assert events == []  # edge-01 in maintenance, edge-02's only problem is a check in maintenance
    after, _ = A.evaluate(fl.alerts, bad, state, NOW + timedelta(hours=2))
    assert sorted((e["node"], e["status"]) for _, e in after) == [("edge-01", "CRITICAL"), ("edge-02", "WARNING")]


@pytest.mark.parametrize(
    ("alert", "line", "why"),
    [('[[alert]]\nname = "x"\n', 7, "needs a webhook or a command"),
     ('[[alert]]\nwebhook = "file:///etc/passwd"\n', 8, "alert.1.webhook: .* is not an http:// or https:// URL"),
     ('[[alert]]\ncommand = "rm -rf /"\n', 8, "alert.1.command: must be a list"),
     ('[[alert]]\ncommand = ["x"]\nrepeat = nan\n', 9, "alert.1.repeat: must be a finite number"),
     ('[[alert]]\ncommand = ["x"]\non = ["BAD"]\n', 9, "alert.1.on: item 1: must be"),
     # accepted before the typed reader: 1e300 retries, a timeout past any deadline
     ('[[alert]]\ncommand = ["x"]\nretries = 1e300\n', 9, "alert.1.retries: must be an integer"),
     ('[[alert]]\ncommand = ["x"]\n\n[[alert]]\ncommand = ["y"]\ntimeout = 1e300\n', 12, "alert.2.timeout: "),
     ('[[alert]]\ncommand = ["x"]\n[[alert.maintenance]]\nstart = "2026-12-01T21:00:00Z"\n'
      'end = "2026-12-01T20:00:00Z"\n', 7, "end after start")],
)  # fmt: skip
def test_bad_alert_entries_are_refused_with_file_and_line(tmp_path: Path, alert: str, line: int, why: str) -> None:
    with pytest.raises(ConfigError, match=rf"fleet\.toml:{line}: .*{why}"):
        fleet(tmp_path, alert)


class Receiver(http.server.BaseHTTPRequestHandler):
    """A REAL local HTTP receiver: answers 500 to the first ``fail`` POSTs, then 200."""

    fail = 2
    bodies: list[Any] = []
    codes: list[int] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.bodies.append(json.loads(body))
        code = 500 if len(self.bodies) <= self.fail else 200
        self.codes.append(code)
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def serve(fail: int) -> tuple[http.server.HTTPServer, type[Receiver]]:
    handler = type("R", (Receiver,), {"fail": fail, "bodies": [], "codes": []})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return srv, handler


def wait_for(path: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def test_alert_reaches_a_real_receiver_after_two_failures_and_a_command_hook(tmp_path: Path) -> None:
    srv, handler = serve(fail=2)
    hook_out = tmp_path / "hook.json"
    hook = tmp_path / "hook.py"
    hook.write_text(f"import sys\nopen({str(hook_out)!r}, 'wb').write(sys.stdin.buffer.read())\n")
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/api/v2/alerts"
        fl = fleet(tmp_path, f'[[alert]]\nname = "ops"\nwebhook = "{url}"\npayload = "alertmanager"\nretries = 3\n'
                   f'backoff = 0.05\ncommand = {json.dumps([sys.executable, str(hook)])}\n')  # fmt: skip
        rep = report(node("edge-01", "CRITICAL", {"disk": "CRITICAL"}), node("edge-02", "OK", {"disk": "OK"}))
        state = tmp_path / "state" / "fleet-alerts.json"
        job = A.fire(fl, rep, state, now=NOW)  # detached: returns before anything is delivered
        assert job is not None
        wait_for(job.with_suffix(".result.json"))
    finally:
        srv.shutdown()
        srv.server_close()
    result = json.loads(job.with_suffix(".result.json").read_text())
    by = {d["target"].split()[0]: d for d in result["deliveries"]}
    assert by["webhook"]["ok"] and by["webhook"]["attempts"] == 3  # 500, 500, then 200
    assert handler.codes == [500, 500, 200]
    [alert] = handler.bodies[-1]  # Alertmanager's /api/v2/alerts body: a list of alerts
    assert alert["labels"] == {"alertname": "AlmaNodeState", "node": "edge-01", "role": "board",
                               "alma_rule": "ops"}  # fmt: skip
    assert alert["annotations"]["severity"] == "critical" and alert["endsAt"] > alert["startsAt"]
    assert by["command"]["ok"] and by["command"]["attempts"] == 1
    [event] = json.loads(hook_out.read_text())  # the run's events for this receiver, one list
    assert event["schema"] == "alma.alert/1" and event["node"] == "edge-01" and event["status"] == "CRITICAL"
    assert json.loads(state.read_text())["ops/edge-01"]["status"] == "CRITICAL"
    assert not (state.with_name("fleet-alerts.log")).exists()  # nothing failed in the end


def test_a_receiver_that_never_answers_well_is_recorded_not_raised(tmp_path: Path) -> None:
    srv, handler = serve(fail=99)
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/hook"
        fl = fleet(tmp_path, f'[[alert]]\nwebhook = "{url}"\nretries = 2\nbackoff = 0.01\n')
        job = A.fire(fl, report(node("edge-01", "WARNING", {"disk": "WARNING"})), tmp_path / "a.json", now=NOW,
                     detach=False)  # fmt: skip
    finally:
        srv.shutdown()
        srv.server_close()
    assert job is not None and len(handler.codes) == 3
    [line] = (tmp_path / "fleet-alerts.log").read_text().splitlines()
    failure = json.loads(line)
    assert failure["ok"] is False and failure["attempts"] == 3 and "500" in failure["error"]


def test_prometheus_output_parses_with_the_official_parser(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    hostile = 'we"ird\\label\n\u202e'
    n = node("edge-01", "WARNING", {"disk": "WARNING", hostile: "OK"})
    n.checks[0].perfdata = [H.Perf("root_free_pct", 12.5, "%"), H.Perf("bad", None), H.Perf(hostile, 3.0, "s")]
    stale = node("edge-02", "UNKNOWN", {"disk": "UNKNOWN"})
    stale.checks[0].stale = True
    path = tmp_path / "textfile" / "alma.prom"
    path.parent.mkdir()
    M.write_textfile(path, report(n, stale, H.NodeResult("edge-03", "board", None, Severity.UNKNOWN, "down",
                                                          reachable=False)))  # fmt: skip
    assert sorted(p.name for p in path.parent.iterdir()) == ["alma.prom"]  # atomic: no temp file left
    families = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    assert {"alma_fleet_status", "alma_node_status", "alma_check_status", "alma_perfdata",
            "alma_node_response_seconds"} <= set(families)  # fmt: skip
    assert all(f.type == "gauge" for f in families.values())
    nodes = {s.labels["node"]: s.value for s in families["alma_node_status"].samples}
    assert nodes == {"edge-01": 1.0, "edge-02": 3.0, "edge-03": 3.0}
    checks = {(s.labels["node"], s.labels["check"], s.labels["stale"]): s.value
              for s in families["alma_check_status"].samples}  # fmt: skip
    assert checks[("edge-02", "disk", "true")] == 3.0
    perf = {(s.labels["label"], s.labels["unit"]): s.value for s in families["alma_perfdata"].samples}
    assert perf[("root_free_pct", "%")] == 12.5 and ("bad", "") not in perf
    weird = [k for k in perf if k[0] != "root_free_pct"][0][0]
    assert "\u202e" not in weird and "\n" not in weird and 'we"ird\\label' in weird  # escaped, round-tripped
    assert families["alma_fleet_status"].samples[0].value == 1.0


@contextlib.contextmanager
def trickler() -> Iterator[int]:
    """A receiver that reads the request, then sends one byte every 0.5 s, forever: every
    socket read succeeds, so only an overall deadline ends the attempt."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    stop = threading.Event()

    def talk(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            while not stop.wait(0.5):
                conn.sendall(b"H")

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=talk, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        srv.close()


def test_a_trickling_webhook_is_ended_by_one_deadline_and_others_still_get_the_storm(tmp_path: Path) -> None:
    srv, handler = serve(fail=0)
    names = [f"edge-{i:02d}" for i in range(1, 21)]
    with trickler() as slow_port:
        text = "".join(f'[[node]]\nname = "{n}"\nrole = "board"\n' for n in names)
        text += f'[[alert]]\nname = "slow"\nwebhook = "http://127.0.0.1:{slow_port}/hook"\ntimeout = 1\nretries = 0\n'
        text += (f'[[alert]]\nname = "ok"\nwebhook = "http://127.0.0.1:{srv.server_address[1]}/api/v2/alerts"\n'
                 'payload = "alertmanager"\n')  # fmt: skip
        fl = parse_fleet(text, tmp_path / "fleet.toml")
        rep = report(*(node(n, "CRITICAL", {"disk": "CRITICAL"}) for n in names))
        done: list[Path | None] = []
        t = threading.Thread(target=lambda: done.append(A.fire(fl, rep, tmp_path / "fleet-alerts.json", now=NOW,
                                                               detach=False)), daemon=True)  # fmt: skip
        t.start()
        t.join(90)  # generous; the trickler would hold a per-read timeout forever
        srv.shutdown()
        srv.server_close()
        assert done, "the deliverer is still held by a receiver that trickles bytes"
    job = done[0]
    assert job is not None
    result = json.loads(job.with_suffix(".result.json").read_text())
    by = {d["rule"]: d for d in result["deliveries"]}
    assert by["slow"]["ok"] is False and "deadline" in by["slow"]["error"]
    assert by["ok"]["ok"] is True and by["ok"]["events"] == 20
    assert len(handler.bodies) == 1 and sorted(a["labels"]["node"] for a in handler.bodies[0]) == names


def test_one_deliverer_per_fleet_and_a_later_run_delivers_what_is_pending(tmp_path: Path) -> None:
    import fcntl

    srv, handler = serve(fail=0)
    try:
        fl = fleet(tmp_path, f'[[alert]]\nname = "ops"\nwebhook = "http://127.0.0.1:{srv.server_address[1]}/h"\n')
        state = tmp_path / "fleet-alerts.json"
        spool = tmp_path / "fleet-alerts.d"
        spool.mkdir(mode=0o700)
        with open(spool / "deliverer.lock", "a") as held:  # another deliverer is at work
            fcntl.flock(held, fcntl.LOCK_EX)
            job = A.fire(fl, report(node("edge-01", "CRITICAL", {"disk": "CRITICAL"})), state, now=NOW, detach=False)
            assert job is not None and A.pending(spool) == [job] and handler.bodies == []
        # The next run has nothing new to say, but finds the job pending and delivers it.
        assert A.fire(fl, report(node("edge-01", "CRITICAL", {"disk": "CRITICAL"})), state,
                      now=NOW + timedelta(seconds=60), detach=False) is None  # fmt: skip
        assert A.pending(spool) == [] and [e["node"] for e in handler.bodies[0]] == ["edge-01"]
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_flapping_node_is_damped(tmp_path: Path) -> None:
    fl = fleet(tmp_path, '[[alert]]\nname = "ops"\ncommand = ["true"]\n')
    state: dict[str, Any] = {}
    kinds = []
    for k in range(7):  # a new state every 5 minutes
        st = "CRITICAL" if k % 2 == 0 else "OK"
        ev, state = A.evaluate(fl.alerts, report(node("edge-01", st, {"disk": st})), state,
                               NOW + timedelta(minutes=5 * k))  # fmt: skip
        kinds += [e["kind"] for _, e in ev]
    assert kinds == ["changed", "changed", "changed", "flapping"]  # the 4th change says "flapping", then quiet
    # CRITICAL since the 7th run; settled after 30 minutes: one event, from what was last sent.
    ev, state = A.evaluate(fl.alerts, report(node("edge-01", "CRITICAL", {"disk": "CRITICAL"})), state,
                           NOW + timedelta(minutes=30 + 30))  # fmt: skip
    assert [(e["kind"], e["previous"], e["status"]) for _, e in ev] == [("changed", "OK", "CRITICAL")]
