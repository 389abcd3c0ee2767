"""Alerts: ``[[alert]]`` entries in the fleet file fire on node state changes.

::

    [[alert]]
    name = "ops"
    on = ["CRITICAL", "WARNING", "UNKNOWN", "OK"]  # entering these states fires (OK = resolved)
    repeat = 3600               # seconds; re-sent while a node stays in a firing state (0: never)
    webhook = "http://alertmanager:9093/api/v2/alerts"
    payload = "alertmanager"    # or "alma" (default): a JSON list of the run's alma.alert/1 events
    command = ["/usr/local/bin/page-oncall", "--team", "lab"]   # argv; stdin = that JSON list
    timeout = 5                 # seconds per attempt, the whole attempt (connect, send, answer)
    retries = 3                 # attempts after the first, backoff 1 s, 2 s, 4 s ...
    backoff = 1.0
    [[alert.maintenance]]       # no alerts for this node (and check) in this window
    node = "edge-01"            # a node name, or "*"
    check = "disk"              # optional: only this check is ignored
    start = "2026-12-01T20:00:00Z"
    end = "2026-12-01T22:00:00Z"

Alertmanager (``payload = "alertmanager"``): one alert per node and rule, its labels
``alertname``, ``node``, ``role``, ``alma_rule``; the state is the ``severity`` annotation, so
WARNING -> CRITICAL updates the one alert instead of opening a second. A firing alert carries
``endsAt`` = its time + ``4 x [panel] stale_after`` and is re-sent (kind ``refresh``, to that
webhook only) once ``2 x stale_after`` passed since it was last sent: the runs come more often
than ``stale_after`` (else the page is stale too), so Alertmanager never ends an alert that is
still firing, and one left behind when alma stops running ends by itself (as Prometheus does).

A node's alert state is the worst of its checks outside maintenance (UNKNOWN when it did
not answer); state per rule and node is kept in ``fleet-alerts.json`` beside the snapshot
(private, 0600). A node seen for the first time counts as having been OK. During a node's
maintenance window its state is not updated, so a problem still there when the window ends
fires then.

Flapping: a node and rule that changed state ``FLAP_CHANGES`` (4) times within an hour sends
one ``flapping`` event, then nothing until it has held one state for 30 minutes; then that
state is sent if it is not the one the receivers last heard of.

Deliveries never hold up the run: ``fire`` writes the run's events to ONE job file (per
receiver: one POST, one command, with every event of the run) in ``fleet-alerts.d`` and
starts a detached deliverer (its own session). One deliverer per fleet at a time (a lock it
holds for its life); it delivers every pending job oldest first, the targets of a job at once
(at most ``MAX_PARALLEL``), each attempt under ONE deadline (``timeout``: a receiver that
trickles a byte at a time is cut off like a silent one), then records every outcome in the
job's ``.result.json`` and every failure in ``fleet-alerts.log`` (one JSON line each). A job
without a result is pending: every run starts a deliverer while one is, so a job left by a
crash goes out with the next run. Webhooks go direct (no proxy from the environment), http
and https only, never following redirects.

Threat model: the fleet file is the operator's (trusted); node text (summaries, check
names) in an event is sanitized and cut (``MAX_SUMMARY``); the hook's argv is the
configured list, never a shell; the event is JSON on stdin, never in argv or the environment.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import socket
import ssl
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from almaboard import fields as F
from almaboard import text as T

from alma.errors import ConfigError
from alma.fleet.severity import Severity, worst
from alma.ground import parse_utc, utc_iso, utc_now, write_atomic

if TYPE_CHECKING:  # types only: health imports inventory, which reads [[alert]] through this module
    from alma.fleet.health import FleetReport, NodeResult

EVENT_SCHEMA = "alma.alert/1"
PAYLOADS = ("alma", "alertmanager")
MAX_SUMMARY = 1000


@dataclass(frozen=True)
class Window:
    node: str
    check: str | None
    start: float
    end: float

    def covers(self, node: str, check: str | None, now: float) -> bool:
        return self.start <= now < self.end and self.node in ("*", node) and (self.check is None or self.check == check)


@dataclass(frozen=True)
class AlertRule:
    name: str
    on: tuple[str, ...] = ("CRITICAL", "WARNING", "UNKNOWN", "OK")
    repeat_s: float = 0.0
    webhook: str | None = None
    payload: str = "alma"
    command: tuple[str, ...] | None = None
    timeout_s: float = 5.0
    retries: int = 3
    backoff_s: float = 1.0
    maintenance: tuple[Window, ...] = field(default_factory=tuple)


_ALERT_FIELDS: F.Schema = {
    "name": F.string(max_len=128),
    "on": F.list_of(F.enum(*Severity.__members__), max_items=len(Severity.__members__)),
    "repeat": F.duration(0.0),  # 0: once per change
    "webhook": F.string(r"https?://\S+", max_len=4096, what="an http:// or https:// URL"),
    "command": F.list_of(F.string(r".+", max_len=4096, what="a non-empty argument"), max_items=256),
    "payload": F.enum(*PAYLOADS),
    "timeout": F.duration(0.1, 3600.0),
    "retries": F.integer(0, 100),
    "backoff": F.duration(0.0, 3600.0),
    "maintenance": F.list_of(F.table()),
}


def parse_alerts(raw: Any, error: Callable[[str], ConfigError], where: F.Where | None = None) -> tuple[AlertRule, ...]:
    """The ``[[alert]]`` tables; ``error(msg)`` makes the loader's file:line error, ``where``
    points a key at its line (almaboard.fields)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise error("[[alert]] must be an array of tables")
    rules = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise error(f"[[alert]] #{i + 1} must be a table")
        try:
            a = F.check(entry, _ALERT_FIELDS, where or F.in_file("[[alert]]"), prefix=("alert", str(i + 1)))
        except ConfigError as exc:
            raise error(exc.message) if where is None else exc from None
        name = a.get("name", f"alert-{i + 1}")
        on = a.get("on", list(AlertRule.on))
        if not on:
            raise error(f"[[alert]] {name!r}: on must list states of {', '.join(Severity.__members__)}")
        webhook, command = a.get("webhook"), a.get("command")
        if command is not None and not command:
            raise error(f'[[alert]] {name!r}: command must be an argv list, e.g. ["/usr/local/bin/notify"]')
        if webhook is None and command is None:
            raise error(f"[[alert]] {name!r}: needs a webhook or a command")
        windows = []
        for w in a.get("maintenance", []):
            try:
                start, end = parse_utc(w["start"]).timestamp(), parse_utc(w["end"]).timestamp()
                node, check = w.get("node", "*"), w.get("check")
                if not isinstance(node, str) or (check is not None and not isinstance(check, str)) or end <= start:
                    raise ValueError("node/check must be strings and end after start")
            except (KeyError, TypeError, ValueError) as exc:
                raise error(f"[[alert]] {name!r}: bad [[alert.maintenance]] window: {exc}") from None
            windows.append(Window(node, check, start, end))
        rules.append(AlertRule(
            name=str(name), on=tuple(on), repeat_s=a.get("repeat", 0.0), webhook=webhook,
            payload=a.get("payload", "alma"), command=tuple(command) if command else None,
            timeout_s=a.get("timeout", 5.0), retries=a.get("retries", 3), backoff_s=a.get("backoff", 1.0),
            maintenance=tuple(windows),
        ))  # fmt: skip
    return tuple(rules)


def default_state_path(snapshot: Path) -> Path:
    return snapshot.with_name("fleet-alerts.json")


def _alert_status(n: NodeResult, rule: AlertRule, now: float) -> tuple[Severity, list[dict[str, str]]] | None:
    """The node's state for this rule (None: the whole node is in maintenance)."""
    if any(w.covers(n.name, None, now) and w.check is None for w in rule.maintenance):
        return None
    checks = [c for c in n.checks if not any(w.covers(n.name, c.name, now) for w in rule.maintenance)]
    if not n.checks:  # unreachable, unparsable: nothing was verified
        return n.status, []
    status = worst(c.status for c in checks) if checks else Severity.OK
    if n.status is Severity.UNKNOWN and not any(c.stale for c in n.checks) and all(
            c.status is not Severity.UNKNOWN for c in checks):  # fmt: skip
        status = worst([status, Severity.UNKNOWN])  # e.g. a duplicate check or the desktop rule cannot tell
    return status, [{"name": T.terminal(c.name)[:64], "status": c.status.name} for c in checks
                    if c.status is not Severity.OK]  # fmt: skip


# Flapping (docs/fleet.md): a node and rule that changed state FLAP_CHANGES times within
# FLAP_WINDOW_S is flapping: one `flapping` event, then none until it has held one state for
# FLAP_SETTLE_S; then that state is sent if it is not the one last sent.
FLAP_CHANGES = 4
FLAP_WINDOW_S = 3600.0
FLAP_SETTLE_S = 1800.0


def _decide(prev: dict[str, Any], status: Severity, rule: AlertRule, t: float,
            run_every_s: float) -> tuple[str | None, str, dict[str, Any]]:  # fmt: skip
    """(event kind or None, the state the receiver last heard of, the new state entry)."""
    before = str(prev.get("status", "OK"))
    notified = str(prev.get("notified", before))
    firing = status is not Severity.OK and status.name in rule.on
    since = float(prev.get("since", t)) if before != "OK" and firing else t
    # Two clocks: `sent` (any event: repeat) and `refreshed` (what Alertmanager last got).
    sent, refreshed = float(prev.get("sent", 0.0)), float(prev.get("refreshed", prev.get("sent", 0.0)))
    changes = [float(c) for c in prev.get("changes", []) if t - float(c) < FLAP_WINDOW_S]
    flapping = bool(prev.get("flapping"))
    if status.name != before:
        changes.append(t)
    kind: str | None = None
    previous = before
    if flapping:
        if not changes or t - changes[-1] >= FLAP_SETTLE_S:  # settled: say where it ended up
            flapping = False
            if status.name != notified and status.name in rule.on:
                kind, previous = "changed", notified
    elif status.name != before and len(changes) >= FLAP_CHANGES:
        flapping, kind = True, "flapping"
    elif status.name != before:
        kind = "changed" if status.name in rule.on else None
    elif firing and rule.repeat_s > 0 and t - sent >= rule.repeat_s:
        kind = "repeat"
    elif (firing and status.name == notified and rule.payload == "alertmanager" and rule.webhook
          and t - refreshed >= 2 * run_every_s):  # fmt: skip
        kind = "refresh"
    entry: dict[str, Any] = {"status": status.name, "notified": notified, "sent": sent, "refreshed": refreshed,
                             "since": since, "changes": changes, "flapping": flapping}  # fmt: skip
    if kind:
        entry["refreshed"] = t
        if kind != "refresh":
            entry["sent"], entry["notified"] = t, status.name
    return kind, previous, entry


def evaluate(rules: tuple[AlertRule, ...], report: FleetReport, state: dict[str, Any], now: datetime,
             run_every_s: float = 900.0) -> tuple[list[tuple[AlertRule, dict[str, Any]]], dict[str, Any]]:  # fmt: skip
    """(rule, event) pairs to deliver, and the new state.

    ``run_every_s``: the longest expected time between runs ([panel] stale_after); a firing
    event is valid for 4 times that (``valid_until``) and refreshed after 2 times that.
    """
    t = now.timestamp()
    new = {k: dict(v) for k, v in state.items() if isinstance(v, dict)}
    out = []
    for rule in rules:
        for n in report.nodes:
            got = _alert_status(n, rule, t)
            if got is None:
                continue
            status, bad = got
            key = f"{rule.name}/{n.name}"
            kind, previous, entry = _decide(new.get(key, {}), status, rule, t, run_every_s)
            new[key] = entry
            if not kind:
                continue
            event = {
                "schema": EVENT_SCHEMA, "rule": rule.name, "kind": kind, "node": n.name, "role": n.role,
                "status": status.name, "previous": previous, "time": utc_iso(now),
                "since": utc_iso(datetime.fromtimestamp(entry["since"], now.tzinfo)),
                "summary": T.terminal(n.summary)[:MAX_SUMMARY], "checks": bad,
            }  # fmt: skip
            if status is not Severity.OK:
                event["valid_until"] = utc_iso(datetime.fromtimestamp(t + 4 * run_every_s, now.tzinfo))
            out.append((rule, event))
    return out, new


def alertmanager_payload(event: dict[str, Any]) -> list[dict[str, Any]]:
    """Prometheus Alertmanager's POST /api/v2/alerts body: one alert per node and rule (the
    state is an annotation, not a label); firing until ``valid_until``, an OK event ends it."""
    resolved = event["status"] == "OK"
    alert: dict[str, Any] = {
        "labels": {"alertname": "AlmaNodeState", "node": event["node"], "role": event["role"],
                   "alma_rule": event["rule"]},
        "annotations": {"summary": event["summary"] or f"{event['node']} is {event['status']}",
                        "severity": (event["previous"] if resolved else event["status"]).lower()},
        "startsAt": event.get("since") or event["time"],
    }  # fmt: skip
    if resolved:
        alert["startsAt"] = event["time"]
        alert["endsAt"] = event["time"]
    elif event.get("valid_until"):
        alert["endsAt"] = event["valid_until"]
    return [alert]


def fire(fleet: Any, report: FleetReport, state_path: Path, *, now: datetime | None = None,
         detach: bool = True) -> Path | None:  # fmt: skip
    """Evaluate the rules, save the state, hand the events to the fleet's one deliverer.

    Returns the job file (None: nothing new to send). A deliverer is started whenever a job
    is pending, so a job left by an earlier run (a crash, a reboot) goes out with this one.
    """
    when = now or utc_now()
    try:
        state = json.loads(state_path.read_text(encoding="utf-8")) if state_path.exists() else {}
        if not isinstance(state, dict):
            state = {}
    except (OSError, ValueError):
        state = {}  # an unreadable state re-fires current problems: noisy, never silent
    events, new = evaluate(fleet.alerts, report, state, when, run_every_s=float(fleet.panel.stale_after))
    try:
        state_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(state_path, json.dumps(new, sort_keys=True), mode=0o600)
    except OSError as exc:
        raise ConfigError(f"cannot write alert state {state_path}: {exc.strerror or exc}") from exc
    spool = state_path.with_name("fleet-alerts.d")
    job = None
    if events:
        spool.mkdir(mode=0o700, exist_ok=True)
        job = spool / f"{when.strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(4)}.json"
        by_rule: dict[str, tuple[AlertRule, list[dict[str, Any]]]] = {}
        for r, e in events:  # one delivery per receiver per run, every event of the run in it
            by_rule.setdefault(r.name, (r, []))[1].append(e)
        jobs = [{"rule": _rule_dict(r), "events": es} for r, es in by_rule.values()]
        write_atomic(job, json.dumps({"log": str(state_path.with_name("fleet-alerts.log")), "jobs": jobs}),
                     mode=0o600)  # fmt: skip
    if not pending(spool):
        return job
    if detach:
        with open(os.devnull, "rb") as null_in, open(spool / "deliverer.err", "ab") as err:
            subprocess.Popen([sys.executable, "-m", "alma.fleet.alerts", str(spool)], stdin=null_in,
                             stdout=subprocess.DEVNULL, stderr=err, start_new_session=True, close_fds=True)  # fmt: skip
    else:
        drain(spool)
    return job


def _rule_dict(r: AlertRule) -> dict[str, Any]:
    return {"name": r.name, "webhook": r.webhook, "payload": r.payload, "command": list(r.command or []),
            "timeout": r.timeout_s, "retries": r.retries, "backoff": r.backoff_s}  # fmt: skip


def pending(spool: Path) -> list[Path]:
    """Jobs not delivered yet (no ``.result.json``), oldest first: the delivery state a later run reads."""
    if not spool.is_dir():
        return []
    return sorted(j for j in spool.glob("*.json") if not j.name.endswith(".result.json")
                  and not j.with_suffix(".result.json").exists())  # fmt: skip


def drain(spool: Path, sleep: Callable[[float], None] = time.sleep) -> int:
    """The fleet's one deliverer: deliver every pending job, oldest first; the number delivered.

    The lock lives as long as this deliverer: a second one finds it taken and leaves its job
    to the holder, which looks again after letting go (so a job written just then is not left).
    """
    done = 0
    while True:
        with open(spool / "deliverer.lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return done  # the holder delivers our job too
            while todo := pending(spool):
                try:
                    deliver_job(todo[0], sleep)
                except (OSError, ValueError, KeyError, TypeError) as exc:  # an unreadable job: recorded, not retried
                    write_atomic(todo[0].with_suffix(".result.json"), json.dumps(
                        {"job": todo[0].name, "error": T.terminal(f"{type(exc).__name__}: {exc}")[:300]}), mode=0o600)
                done += 1
        if not pending(spool):
            return done


class DeliveryError(Exception):
    """A target refused, failed or missed its deadline."""


def _post(url: str, body: bytes, deadline: float) -> None:
    """POST ``body`` and read the status line, all before ``deadline`` (monotonic): one
    deadline for the whole attempt, however slowly the receiver trickles its bytes. Direct
    (no proxy from the environment), never following a redirect (only 2xx counts)."""
    u = urllib.parse.urlsplit(url)
    host, port = u.hostname or "", u.port or (443 if u.scheme == "https" else 80)

    def left() -> float:
        rest = deadline - time.monotonic()
        if rest <= 0:
            raise TimeoutError
        return rest

    try:
        got = _exchange(u, host, port, body, left)
    except TimeoutError:
        raise DeliveryError("deadline passed") from None
    parts = got.split(b"\r\n", 1)[0].split()
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise DeliveryError(f"no HTTP status line: {T.terminal(got[:80].decode(errors='replace'))!r}")
    if not 200 <= int(parts[1]) < 300:
        raise DeliveryError(f"HTTP {int(parts[1])}")


def _exchange(u: urllib.parse.SplitResult, host: str, port: int, body: bytes, left: Callable[[], float]) -> bytes:
    """Send the request, return the answer's first bytes (up to its status line)."""
    with contextlib.ExitStack() as stack:
        sock = stack.enter_context(socket.create_connection((host, port), timeout=left()))
        if u.scheme == "https":
            sock.settimeout(left())
            sock = stack.enter_context(ssl.create_default_context().wrap_socket(sock, server_hostname=host))
        target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        head = (f"POST {target} HTTP/1.1\r\nHost: {u.netloc.rpartition('@')[2]}\r\nUser-Agent: alma-alerts\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
        sock.settimeout(left())
        sock.sendall(head.encode("ascii") + body)
        got = b""
        while b"\r\n" not in got and len(got) < 4096:
            sock.settimeout(left())
            chunk = sock.recv(4096)
            if not chunk:
                break
            got += chunk
    return got


def _hook(argv: list[str], body: bytes, deadline: float) -> None:
    # The configured argv, never a shell; the events on stdin only.
    left = max(0.001, deadline - time.monotonic())
    r = subprocess.run(argv, input=body, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=left,
                       check=False, start_new_session=True)  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"exit {r.returncode}: {T.terminal(r.stderr.decode(errors='replace').strip())[-200:]}")


def _attempt(what: Callable[[float], None], timeout: float, retries: int, backoff: float,
             sleep: Callable[[float], None]) -> tuple[bool, int, str | None]:  # fmt: skip
    """Up to ``retries + 1`` attempts, each under one deadline of ``timeout`` seconds."""
    last = None
    for attempt in range(retries + 1):
        if attempt:
            sleep(backoff * (2 ** (attempt - 1)))
        try:
            what(time.monotonic() + timeout)
            return True, attempt + 1, None
        except (OSError, RuntimeError, DeliveryError, subprocess.TimeoutExpired, ValueError) as exc:
            last = T.terminal(f"{type(exc).__name__}: {exc}")[:300]
    return False, retries + 1, last


# Targets delivered at once: a silent receiver costs one slot, never the others' turn.
MAX_PARALLEL = 8


def _targets(rule: dict[str, Any], events: list[dict[str, Any]]) -> list[tuple[str, Callable[[float], None]]]:
    out: list[tuple[str, Callable[[float], None]]] = []
    if rule["webhook"]:
        if rule["payload"] == "alertmanager":
            body = json.dumps([a for e in events for a in alertmanager_payload(e)]).encode()
        else:
            body = json.dumps([e for e in events if e["kind"] != "refresh"]).encode()
        if rule["payload"] == "alertmanager" or any(e["kind"] != "refresh" for e in events):
            out.append((f"webhook {rule['webhook']}", partial(_post, str(rule["webhook"]), body)))
    told = [e for e in events if e["kind"] != "refresh"]  # a refresh only keeps Alertmanager's alert alive
    if rule["command"] and told:
        argv = [str(x) for x in rule["command"]]
        out.append((f"command {argv[0]}", partial(_hook, argv, json.dumps(told).encode())))
    return out


def deliver_job(job: Path, sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Deliver one job, its targets at once (bounded); record outcomes (.result.json) and failures (the log)."""
    data = json.loads(job.read_text(encoding="utf-8"))
    work = []
    for item in data["jobs"]:
        rule = item["rule"]
        events = item["events"] if "events" in item else [item["event"]]  # a job of an older alma
        for target, call in _targets(rule, events):
            work.append((rule, events, target, call))

    def one(w: tuple[dict[str, Any], list[dict[str, Any]], str, Callable[[float], None]]) -> dict[str, Any]:
        rule, events, target, call = w
        ok, attempts, error = _attempt(call, float(rule["timeout"]), int(rule["retries"]), float(rule["backoff"]),
                                       sleep)  # fmt: skip
        return {"rule": rule["name"], "nodes": sorted({e["node"] for e in events}), "events": len(events),
                "target": target, "ok": ok, "attempts": attempts, "error": error, "time": utc_iso()}  # fmt: skip

    with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, len(work)))) as pool:
        results = list(pool.map(one, work))
    failed = [r for r in results if not r["ok"]]
    if failed:
        with open(data["log"], "a", encoding="utf-8") as log:
            log.writelines(json.dumps(r) + "\n" for r in failed)
    out = {"job": job.name, "deliveries": results}
    write_atomic(job.with_suffix(".result.json"), json.dumps(out, indent=1), mode=0o600)
    return out


if __name__ == "__main__":  # the detached deliverer: python -m alma.fleet.alerts SPOOL_DIR
    drain(Path(sys.argv[1]))
