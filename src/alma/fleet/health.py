"""Fleet-wide health: run ``alma-health --json`` on every node in parallel and aggregate.

A node that cannot be reached, does not answer in time, prints more than the output cap,
answers with anything but exactly one ``alma.health/1`` report with at least one check
(text before or after it, a second report, NaN/Infinity), or answers with a report older
than ``stale_after`` is UNKNOWN, never OK, and the summary says why. The fleet's status is
the worst node status (OK < UNKNOWN < WARNING < CRITICAL) and is the exit code of
``alma fleet health``.

Invariants (each attacked by a named test in tests/fleet/test_health_unit.py):

- Bounded in time: ONE deadline per node covers connect, read AND judging the report; a
  node whose answer was not judged by then is UNKNOWN. Judging is linear in the report
  (sets and dicts, never ``list.count`` per check), so the cap on the output bounds it.
- Honest cells: a stale (or future-dated) report's checks are not shown as they were
  reported: each becomes UNKNOWN with ``stale`` set, and its perfdata is not published as
  current; an unreachable node has no checks at all ("not reported" on every output).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import Counter
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
KNOWN_CHECKS = ("storm", "memory", "gpu", "thermal", "links", "watchdog", "disk", "ota_cert")
MAX_WORKERS = 32
# Judging runs after the read; this much past the deadline is scheduling noise, not a slow judge.
JUDGE_GRACE_S = 0.5


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
    # The report is too old (or from the future) to vouch for this check: its status is
    # UNKNOWN and ``reported`` keeps what the node said back then, for the operator only.
    stale: bool = False
    reported: str | None = None


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
    updating: bool = False  # an `alma update` record shows it mid-update

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not self.updating:
            del d["updating"]  # only the mid-update board carries the key
        d["status"] = self.status.name
        d["code"] = self.status.code
        for c in d["checks"]:
            c["status"] = c["status"].name
            if not c["stale"]:
                del c["stale"], c["reported"]
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
        """The project's own check names that some node reported, in the fixed order.

        Columns never come from a report: a node inventing 40 checks adds no column.
        """
        seen = {ch.name for n in self.nodes for ch in n.checks}
        return [c for c in (*KNOWN_CHECKS, desktop.CHECK_NAME) if c in seen]

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


def parse_report(text: str, node: Node, *, now: datetime, stale_after: float, duration_s: float = 0.0,
                 fleet_names: frozenset[str] = frozenset()) -> NodeResult:  # fmt: skip
    """Turn a node's output into a NodeResult; any deviation from the contract is UNKNOWN.

    ``fleet_names`` (casefolded): a report whose ``node`` is ANOTHER node of the fleet came
    from the wrong board (a swapped address, a stale DNS entry): UNKNOWN naming both. A
    hostname outside the fleet is not judged (a node's name need not be its hostname).
    """

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
            name = raw["name"].casefold() if raw["name"].casefold() in KNOWN_CHECKS else raw["name"]  # DISK: disk
            checks.append(Check(name, Severity.parse(raw.get("status")), str(raw.get("summary", "")), perf))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return unknown(f"malformed {REPORT_SCHEMA} report: {exc}")
    if not checks:
        return unknown("report with no checks: nothing was verified")
    said = data.get("node")
    if isinstance(said, str) and said.strip():
        other = said.strip().casefold()
        mine = node.name.casefold()
        if mine not in (other, other.split(".")[0]) and (other in fleet_names or other.split(".")[0] in fleet_names):
            return unknown(f"the report is from {T.terminal(said)[:64]!r}, not from {node.name!r}: "
                           f"another node answered at {T.terminal(node.ssh)[:64]}")  # fmt: skip
    # Names compared case-insensitively: "disk" OK beside "DISK" CRITICAL is no green disk.
    counts = Counter(c.name.casefold() for c in checks)  # linear: 35,000 checks are judged in milliseconds
    twice = sorted(n for n, k in counts.items() if k > 1)
    if twice:
        if len(twice) > 5:
            twice = [*twice[:5], f"and {len(twice) - 5} more"]
        return unknown(f"check(s) reported twice: {', '.join(twice)}")

    if not any(name in counts for name in KNOWN_CHECKS):  # invented checks only: nothing expected was verified
        got = ", ".join(T.terminal(c.name)[:32] for c in checks[:5]) + (" ..." if len(checks) > 5 else "")
        return unknown(f"none of the expected checks ({', '.join(KNOWN_CHECKS)}) reported; got: {got}")

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
        _mark_stale(checks)
    elif age < -stale_after:
        result.status = Severity.UNKNOWN
        result.summary = f"report time {utc_iso(t)} is {-age:.0f} s in the future: the node's clock is wrong"
        _mark_stale(checks)
    else:
        bad = [f"{c.name} {c.status.name}: {c.summary}" for c in checks if c.status is not Severity.OK]
        result.summary = "; ".join(bad) if bad else f"all {len(checks)} checks OK"
    return result


def _mark_stale(checks: list[Check]) -> None:
    """A stale report vouches for nothing now: every check UNKNOWN/stale, no current perfdata."""
    for c in checks:
        c.reported, c.status, c.stale, c.perfdata = c.status.name, Severity.UNKNOWN, True, []


def node_from_remote(res: RemoteResult, node: Node, *, now: datetime, stale_after: float,
                     fleet_names: frozenset[str] = frozenset()) -> NodeResult:  # fmt: skip
    if res.error:
        return NodeResult(
            node.name, node.role, node.alias, Severity.UNKNOWN, res.why(), duration_s=res.duration_s,
            reachable=False,
        )  # fmt: skip
    return parse_report(res.text, node, now=now, stale_after=stale_after, duration_s=res.duration_s,
                        fleet_names=fleet_names)  # fmt: skip


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
    ticks: Callable[[], float] = time.monotonic,
) -> FleetReport:
    """Query every node in parallel, each call bounded by ``timeout`` (fleet default)."""
    if remote is run_remote:
        require_ssh()
    per_node = timeout if timeout is not None else fleet.timeout
    targets = list(nodes or fleet.nodes)
    cancel = runner.Deadline(None, phase="fleet health")
    jobs: dict[tuple[str, str], Future[Any]] = {}
    lock = threading.Lock()

    def call(node: Node, command: str) -> RemoteResult:
        res: RemoteResult = remote(node, command, fleet.ssh, timeout=per_node, cancel=cancel,
                                   max_output=fleet.max_output)  # fmt: skip
        if on_done:
            with lock:
                on_done(node.name)
        return res

    def judged(node: Node) -> NodeResult:
        """The node's whole budget, connect + read + judge, is ``per_node`` (one deadline)."""
        started = ticks()
        res = call(node, node.health_command)
        result = node_from_remote(res, node, now=clock(), stale_after=fleet.stale_after, fleet_names=names)
        spent = ticks() - started
        if spent > per_node + JUDGE_GRACE_S and result.reachable:
            return NodeResult(node.name, node.role, node.alias, Severity.UNKNOWN,
                              f"no verdict within the {per_node:g} s deadline ({spent:.1f} s to connect, read "
                              "and judge the report)", duration_s=spent)  # fmt: skip
        return result

    names = frozenset(n.name.casefold() for n in fleet.nodes)
    n_calls = sum(3 if n.role == "desktop" else 1 for n in targets)
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_WORKERS, n_calls))) as pool:
        for n in targets:
            jobs[(n.name, "health")] = pool.submit(judged, n)
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
        r = jobs[(n.name, "health")].result()
        if n.role == "desktop":
            add_desktop_rule(r, jobs[(n.name, "gpu")].result(), jobs[(n.name, "ps")].result())
        results.append(r)
    _mark_updating(results)
    return FleetReport(time=utc_iso(now), nodes=results, stale_after=fleet.stale_after)


def _mark_updating(results: list[NodeResult]) -> None:
    """A board `alma update` is rebooting or judging is WARNING "mid-update", not CRITICAL."""
    from alma.update.records import updating

    busy = updating()
    for r in results:
        if r.name not in busy:
            continue
        r.updating = True
        if r.status in (Severity.CRITICAL, Severity.UNKNOWN):
            r.status = Severity.WARNING
        r.summary = f"mid-update: {busy[r.name]}; {r.summary}"


# ---- Nagios output -----------------------------------------------------------------------


def perf_item(label: str, value: float | None, uom: str = "", warn: float | None = None, crit: float | None = None,
              lo: float | None = None, hi: float | None = None, low: bool = False) -> str | None:  # fmt: skip
    """One perfdata item through the board library's one sanitizer (None: no sane value)."""
    return T.perf_item(label, value, uom, warn, crit, lo, hi, low=low)


NAGIOS_MAX = 4096  # bytes of plugin output: Nagios' and NRPE's smallest common buffer
_ELLIPSIS = "\u2026"


def _clip(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` UTF-8 bytes, an ellipsis marking a cut."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    if limit < 4:
        return ""
    return raw[: limit - 3].decode("utf-8", "ignore") + _ELLIPSIS


def perf_items(report: FleetReport) -> list[str]:
    """Every perfdata item, labels ``node/label`` (node names hold no '/': unambiguous), each
    label once (a node repeating a label keeps its first), fleet counts first."""
    counts = {s: sum(1 for n in report.nodes if n.status is s) for s in Severity}
    total = len(report.nodes)
    items = [perf_item(f"nodes_{s.name.lower()}", counts[s], lo=0, hi=total) for s in Severity]
    seen: set[str] = set()
    for n in report.nodes:
        wanted = [(f"{n.name}/response", Perf("response", round(n.duration_s, 3), "s", min=0))]
        wanted += [(f"{n.name}/{T.nagios_label(p.label)}", p) for c in n.checks for p in c.perfdata]
        for label, p in wanted:
            if label in seen:
                continue
            seen.add(label)
            items.append(perf_item(label, p.value, p.uom, p.warn, p.crit, p.min, p.max, p.low))
    return [i for i in items if i is not None]


def nagios_line(report: FleetReport, limit: int = NAGIOS_MAX) -> str:
    """One status line with perfdata, at most ``limit`` bytes (check_by_ssh/NRPE).

    Perfdata is what graphs are drawn from, so it is kept before prose: the node summaries
    are cut first (with an ellipsis), then, only if the perfdata alone is over the limit,
    the items that do not fit are left out and the text says how many.
    """
    counts = {s: sum(1 for n in report.nodes if n.status is s) for s in Severity}
    parts = [
        f"{counts[s]} {s.name.lower()}" for s in (Severity.CRITICAL, Severity.WARNING, Severity.UNKNOWN, Severity.OK)
    ]
    head = f"FLEET {report.status.name} - {len(report.nodes)} nodes: {', '.join(parts)}"
    reserve = len(head.encode()) + 200  # room for the omitted-count and a first summary
    kept, used = [], 0
    items = perf_items(report)
    for item in items:
        size = len(item.encode()) + 1
        if reserve + 3 + used + size > limit:
            break
        kept.append(item)
        used += size
    if len(kept) < len(items):
        head += f"; perfdata of {len(items) - len(kept)} item(s) left out (output limit {limit} B)"
    perf = " ".join(kept)
    bad = sorted((n for n in report.nodes if n.status is not Severity.OK), key=lambda n: -n.status.rank)
    # nagios_text: one line, no '|' (it would start perfdata), no terminal escapes.
    text = T.nagios_text(head)
    room = limit - len(text.encode()) - len(perf.encode()) - 3
    for n in bad:
        piece = T.nagios_text(f"; {n.name} {n.status.name}: {n.summary}")
        if room <= len(_ELLIPSIS.encode()) + 2:
            break
        piece = _clip(piece, min(room, 300))  # one node's summary never crowds out the others
        text += piece
        room -= len(piece.encode())
    return f"{text} | {perf}"


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
