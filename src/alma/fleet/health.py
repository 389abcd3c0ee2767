"""Fleet-wide health: run ``alma-health --json`` on every node in parallel and aggregate.

A node that cannot be reached, does not answer in time, prints more than the output cap,
answers with anything but exactly one ``alma.health/1`` report with at least one check
(text before or after it, a second report, NaN/Infinity), or answers with a report older
than ``stale_after`` is UNKNOWN, never OK, and the summary says why. The fleet's status is
the worst node status (OK < UNKNOWN < WARNING < CRITICAL) and is the exit code of
``alma fleet health``.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from almaboard import text as T

from alma import runner
from alma.errors import ConfigError, Interrupted
from alma.fleet import desktop
from alma.fleet.inventory import Fleet, Node
from alma.fleet.severity import Severity, worst
from alma.fleet.ssh import RemoteResult, require_ssh, run_remote
from alma.ground import parse_utc, utc_iso, utc_now, write_atomic

REPORT_SCHEMA = "alma.health/1"
SNAPSHOT_SCHEMA = "alma.fleet-health/1"
# Checks every on-board report carries (docs/formats.md); the table shows them in this order.
KNOWN_CHECKS = ("storm", "memory", "gpu", "thermal", "links", "watchdog", "disk")
MAX_WORKERS = 32


def default_snapshot_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "alma" / "fleet-health.json"


@dataclass
class Perf:
    label: str
    value: float | None
    uom: str = ""
    warn: float | None = None
    crit: float | None = None
    min: float | None = None
    max: float | None = None
    # Thresholds are lower bounds (alert when the value falls BELOW them, e.g. free %).
    # The JSON contract carries no direction; warn > crit can only mean lower bounds.
    low: bool = False


@dataclass
class Check:
    name: str
    status: Severity
    summary: str = ""
    perfdata: list[Perf] = field(default_factory=list)


@dataclass
class NodeResult:
    name: str
    role: str
    alias: str | None
    status: Severity
    summary: str
    checks: list[Check] = field(default_factory=list)
    report_time: str | None = None
    duration_s: float = 0.0
    reachable: bool = True

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.name
        d["code"] = self.status.code
        for c in d["checks"]:
            c["status"] = c["status"].name
        return d


@dataclass
class FleetReport:
    time: str
    nodes: list[NodeResult]
    stale_after: float

    @property
    def status(self) -> Severity:
        return worst(n.status for n in self.nodes)

    @property
    def exit_code(self) -> int:
        return self.status.code

    def check_names(self) -> list[str]:
        names = [c for c in KNOWN_CHECKS if any(ch.name == c for n in self.nodes for ch in n.checks)]
        for n in self.nodes:
            for ch in n.checks:
                if ch.name not in names:
                    names.append(ch.name)
        return names

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SNAPSHOT_SCHEMA,
            "time": self.time,
            "status": self.status.name,
            "code": self.exit_code,
            "stale_after": self.stale_after,
            "nodes": [n.to_dict() for n in self.nodes],
        }


class ReportError(ValueError):
    """The node's output is not exactly one strict-JSON report; the message says why."""


def _reject_constant(name: str) -> Any:
    raise ReportError(f"not strict JSON: {name} is not a number")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def extract_report(text: str) -> Any:
    """The ONE JSON document that is the node's whole stdout (stderr arrives apart).

    Anything before it, after it, or a second document makes the output untrustworthy: a
    command that prints a forged "all OK" report before the real one must not win.
    """
    stripped = text.strip()
    if not stripped:
        raise ReportError("empty output (no report)")
    try:
        obj, end = _DECODER.raw_decode(stripped)
    except RecursionError:  # "[[[[..." a megabyte deep must not crash the whole fleet run
        raise ReportError("unparsable health output: JSON nested too deeply") from None
    except json.JSONDecodeError:
        first = next((ln.strip() for ln in stripped.splitlines() if ln.strip()), "")
        raise ReportError(f"unparsable health output: {first[:200]}") from None
    rest = stripped[end:].lstrip()
    if rest:
        try:
            _DECODER.raw_decode(rest)
        except (json.JSONDecodeError, ReportError, RecursionError):
            raise ReportError(f"trailing output after the report: {rest.splitlines()[0][:80]!r}") from None
        raise ReportError("two reports in the output (only exactly one is trusted)")
    return obj


def _float(v: Any) -> float | None:
    """A perfdata number; None when absent, or when it is no finite float (1e400, 10**400)."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        try:
            f = float(v)
        except OverflowError:
            return None
        return f if math.isfinite(f) else None
    raise ValueError(f"not a number: {v!r}")


def _is_low(p: dict[str, Any]) -> bool:
    if isinstance(p.get("low"), bool):
        return bool(p["low"])
    warn, crit = _float(p.get("warn")), _float(p.get("crit"))
    return warn is not None and crit is not None and warn > crit


def parse_report(text: str, node: Node, *, now: datetime, stale_after: float, duration_s: float = 0.0) -> NodeResult:
    """Turn a node's output into a NodeResult; any deviation from the contract is UNKNOWN."""

    def unknown(why: str) -> NodeResult:
        return NodeResult(node.name, node.role, node.alias, Severity.UNKNOWN, why, duration_s=duration_s)

    try:
        data = extract_report(text)
    except ReportError as exc:
        return unknown(str(exc))
    if not isinstance(data, dict) or data.get("schema") != REPORT_SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        return unknown(f"not an {REPORT_SCHEMA} report (schema {got!r})")
    try:
        reported = Severity.parse(data.get("status"))
        t = parse_utc(data.get("time"))
        checks = []
        raw_checks = data.get("checks")
        if not isinstance(raw_checks, list):
            raise ValueError("no checks list")
        for raw in raw_checks:
            if not isinstance(raw.get("name"), str) or not isinstance(raw.get("summary", ""), str):
                raise ValueError("a check's name and summary must be strings")
            perf = [
                Perf(
                    label=str(p["label"]),
                    value=_float(p.get("value")),
                    uom=str(p.get("uom") or ""),
                    warn=_float(p.get("warn")),
                    crit=_float(p.get("crit")),
                    min=_float(p.get("min")),
                    max=_float(p.get("max")),
                    low=_is_low(p),
                )
                for p in raw.get("perfdata") or []
            ]
            checks.append(Check(str(raw["name"]), Severity.parse(raw.get("status")), str(raw.get("summary", "")), perf))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return unknown(f"malformed {REPORT_SCHEMA} report: {exc}")
    if not checks:
        return unknown("report with no checks: nothing was verified")
    names = [c.name for c in checks]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        return unknown(f"check(s) reported twice: {', '.join(twice)}")

    age = (now - t).total_seconds()
    result = NodeResult(
        node.name,
        node.role,
        node.alias,
        worst([reported, *(c.status for c in checks)]),
        "",
        checks,
        report_time=utc_iso(t),
        duration_s=duration_s,
    )
    if age > stale_after:
        result.status = Severity.UNKNOWN
        result.summary = f"stale report: taken at {utc_iso(t)}, {age:.0f} s old (limit {stale_after:.0f} s)"
    elif age < -stale_after:
        result.status = Severity.UNKNOWN
        result.summary = f"report time {utc_iso(t)} is {-age:.0f} s in the future: the node's clock is wrong"
    else:
        bad = [f"{c.name} {c.status.name}: {c.summary}" for c in checks if c.status is not Severity.OK]
        result.summary = "; ".join(bad) if bad else f"all {len(checks)} checks OK"
    return result


def node_from_remote(res: RemoteResult, node: Node, *, now: datetime, stale_after: float) -> NodeResult:
    if res.error:
        return NodeResult(
            node.name, node.role, node.alias, Severity.UNKNOWN, res.why(), duration_s=res.duration_s,
            reachable=False,
        )  # fmt: skip
    return parse_report(res.text, node, now=now, stale_after=stale_after, duration_s=res.duration_s)


def add_desktop_rule(result: NodeResult, gpu: RemoteResult, ps: RemoteResult) -> None:
    """Add the lab rule as its own check on a desktop node and fold it into the status."""
    status, summary = desktop.evaluate(
        gpu.returncode,
        gpu.text,
        gpu.why() if gpu.error else None,
        ps.returncode,
        ps.text,
        ps.why() if ps.error else None,
    )
    result.checks.append(Check(desktop.CHECK_NAME, status, summary))
    if status is not Severity.OK:
        result.summary = f"{summary}; {result.summary}" if result.summary else summary
    result.status = worst([result.status, status])


def run_fleet_health(
    fleet: Fleet,
    *,
    timeout: float | None = None,
    nodes: list[Node] | None = None,
    on_done: Callable[[str], None] | None = None,
    clock: Callable[[], datetime] = utc_now,
    remote: Callable[..., RemoteResult] = run_remote,
) -> FleetReport:
    """Query every node in parallel, each call bounded by ``timeout`` (fleet default)."""
    if remote is run_remote:
        require_ssh()
    per_node = timeout if timeout is not None else fleet.timeout
    targets = list(nodes or fleet.nodes)
    cancel = runner.Deadline(None, phase="fleet health")
    jobs: dict[tuple[str, str], Future[RemoteResult]] = {}
    lock = threading.Lock()

    def call(node: Node, command: str) -> RemoteResult:
        res: RemoteResult = remote(node, command, fleet.ssh, timeout=per_node, cancel=cancel,
                                   max_output=fleet.max_output)  # fmt: skip
        if on_done:
            with lock:
                on_done(node.name)
        return res

    n_calls = sum(3 if n.role == "desktop" else 1 for n in targets)
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_WORKERS, n_calls))) as pool:
        for n in targets:
            jobs[(n.name, "health")] = pool.submit(call, n, n.health_command)
            if n.role == "desktop":
                jobs[(n.name, "gpu")] = pool.submit(call, n, desktop.GPU_APPS_COMMAND)
                jobs[(n.name, "ps")] = pool.submit(call, n, desktop.PS_COMMAND)
        try:
            pending = set(jobs.values())
            while pending:
                _, pending = wait_futures(pending, timeout=0.2)
        except KeyboardInterrupt:
            cancel.reset(0, "interrupted")  # every call in flight stops its ssh process group
            wait_futures(list(jobs.values()))
            raise Interrupted("fleet health interrupted; every ssh call was stopped") from None

    now = clock()
    results = []
    for n in targets:
        r = node_from_remote(jobs[(n.name, "health")].result(), n, now=now, stale_after=fleet.stale_after)
        if n.role == "desktop":
            add_desktop_rule(r, jobs[(n.name, "gpu")].result(), jobs[(n.name, "ps")].result())
        results.append(r)
    _mark_updating(results)
    return FleetReport(time=utc_iso(now), nodes=results, stale_after=fleet.stale_after)


def _mark_updating(results: list[NodeResult]) -> None:
    """issue 23: a board `alma update` is rebooting or judging is WARNING "mid-update", not CRITICAL."""
    from alma.update.records import updating

    busy = updating()
    for r in results:
        if r.name in busy and r.status in (Severity.CRITICAL, Severity.UNKNOWN):
            r.status = Severity.WARNING
            r.summary = f"mid-update: {busy[r.name]}; {r.summary}"


# ---- Nagios output -----------------------------------------------------------------------


def perf_item(label: str, value: float | None, uom: str = "", warn: float | None = None, crit: float | None = None,
              lo: float | None = None, hi: float | None = None, low: bool = False) -> str | None:  # fmt: skip
    """One perfdata item through the board library's one sanitizer (None: no sane value)."""
    return T.perf_item(label, value, uom, warn, crit, lo, hi, low=low)


def nagios_line(report: FleetReport) -> str:
    """One status line with perfdata, for check_by_ssh/NRPE-style integration."""
    counts = {s: sum(1 for n in report.nodes if n.status is s) for s in Severity}
    total = len(report.nodes)
    parts = [
        f"{counts[s]} {s.name.lower()}" for s in (Severity.CRITICAL, Severity.WARNING, Severity.UNKNOWN, Severity.OK)
    ]
    text = f"FLEET {report.status.name} - {total} nodes: {', '.join(parts)}"
    bad = sorted((n for n in report.nodes if n.status is not Severity.OK), key=lambda n: -n.status.rank)
    if bad:
        text += "; " + "; ".join(f"{n.name} {n.status.name}: {n.summary}" for n in bad)
    items = [perf_item(f"nodes_{s.name.lower()}", counts[s], lo=0, hi=total) for s in Severity]
    for n in report.nodes:
        items.append(perf_item(f"{n.name}_response", round(n.duration_s, 3), "s", lo=0))
        for c in n.checks:
            for p in c.perfdata:
                items.append(perf_item(f"{n.name}_{p.label}", p.value, p.uom, p.warn, p.crit, p.min, p.max, p.low))
    perf = " ".join(i for i in items if i is not None)
    # nagios_text: one line, no '|' (it would start perfdata), no terminal escapes.
    return f"{T.nagios_text(text)} | {perf}"


# ---- snapshot ----------------------------------------------------------------------------


def to_json(report: FleetReport) -> str:
    """The snapshot as strict JSON (finite numbers only: Node's JSON.parse must read it)."""
    return T.dumps(report.to_dict(), indent=2, sort_keys=True) + "\n"


def save_snapshot(report: FleetReport, path: Path) -> None:
    write_atomic(path, to_json(report))


def load_snapshot(path: Path) -> dict[str, Any]:
    try:
        data = T.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"no fleet health snapshot at {path}", hint="run `alma fleet health` first (it saves the snapshot)"
        ) from None
    except (OSError, ValueError, RecursionError) as exc:  # JSONDecodeError, NaN/Infinity, bad UTF-8
        raise ConfigError(f"cannot read snapshot {path}: {exc}", hint="run `alma fleet health` again") from exc
    if not isinstance(data, dict) or data.get("schema") != SNAPSHOT_SCHEMA or not isinstance(data.get("nodes"), list):
        raise ConfigError(f"{path} is not an {SNAPSHOT_SCHEMA} snapshot", hint="run `alma fleet health` again")
    try:
        parse_utc(data.get("time"))
    except ValueError as exc:
        raise ConfigError(f"{path}: bad time: {exc}", hint="run `alma fleet health` again") from exc
    return data
