"""``alma fleet inspect``: a read-only capacity and topology snapshot before a handover.

Only the commands in ``ALLOWED_COMMANDS`` can be sent to a node (``_send`` refuses
anything else), none of which changes anything. What was read is reported as "verified
live at <time>"; what could not be read is "not checked", with the failed command and why.
Memory capacity is ``available`` from ``free -b``; GPU allocations are never added to it
(unified-memory boards share one pool), and budgets are per node, never summed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from almaboard import text as T

from alma import runner
from alma.errors import Interrupted
from alma.fleet import parsers as P
from alma.fleet.desktop import GPU_APPS_COMMAND
from alma.fleet.inventory import Fleet, Node
from alma.fleet.ssh import RemoteResult, require_ssh, run_remote
from alma.ground import utc_iso, utc_now

SCHEMA = "alma.fleet-inspect/1"
_ISO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
DATE = "date -u +%Y-%m-%dT%H:%M:%SZ"
FREE = "free -b"
EARLYOOM = "systemctl is-active earlyoom"
SWAPON = "swapon --show --bytes --noheadings --raw"
IP_BRIEF = "ip -br -4 address"
RDMA = "rdma link show"
# -s: reading carrier/speed of a down link fails with EINVAL; grep would report that on
# stderr in several small writes, which ssh interleaves byte-wise with stdout in our one
# stream (seen: "grep: /sys/class/net/ifb0/carrier/sys/class/net/lo/carrier:1"). Without the
# message, an interface listed by its operstate but lacking a carrier line is "unreadable".
PORTS = "grep -s -H . /sys/class/net/*/carrier /sys/class/net/*/speed /sys/class/net/*/operstate"

# The ONLY commands inspect may send. Each only reads; none takes an argument from input.
ALLOWED_COMMANDS: tuple[str, ...] = (DATE, FREE, GPU_APPS_COMMAND, EARLYOOM, SWAPON, IP_BRIEF, RDMA, PORTS)


class NotAllowed(RuntimeError):
    """A command outside the read-only allow-list was about to be sent (a bug, never user input)."""


@dataclass
class NodeInspection:
    name: str
    role: str
    verified_at: str | None = None  # local UTC clock when the last answer arrived
    node_clock: str | None = None  # the node's own UTC clock (date -u)
    verified: dict[str, Any] = field(default_factory=dict)
    not_checked: list[dict[str, str]] = field(default_factory=list)
    failed_commands: list[dict[str, str]] = field(default_factory=list)
    commands: list[dict[str, Any]] = field(default_factory=list)
    # Lines that were not in the command's format (login-shell rc noise, stray stderr).
    ignored_output: list[dict[str, Any]] = field(default_factory=list)

    @property
    def reachable(self) -> bool:
        return bool(self.verified)

    def skip(self, item: str, reason: str) -> None:
        self.not_checked.append({"item": item, "reason": reason})

    def failed(self, res: RemoteResult) -> str:
        why = res.why()
        self.failed_commands.append({"command": res.command, "why": why})
        return why

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "reachable": self.reachable,
            "verified_at": self.verified_at,
            "node_clock": self.node_clock,
            "verified": self.verified,
            "not_checked": self.not_checked,
            "failed_commands": self.failed_commands,
            "commands": self.commands,
            "ignored_output": self.ignored_output,
        }


def _send(node: Node, command: str, fleet: Fleet, timeout: float, cancel: runner.Deadline,
          remote: Callable[..., RemoteResult]) -> RemoteResult:  # fmt: skip
    if command not in ALLOWED_COMMANDS:
        raise NotAllowed(f"refusing to send {command!r}: not in the read-only allow-list")
    res: RemoteResult = remote(node, command, fleet.ssh, timeout=timeout, cancel=cancel, max_output=fleet.max_output)
    return res


def collect(
    fleet: Fleet,
    nodes: list[Node],
    *,
    timeout: float | None = None,
    remote: Callable[..., RemoteResult] = run_remote,
    clock: Callable[[], datetime] = utc_now,
    on_done: Callable[[str, str], None] | None = None,
) -> tuple[str, list[NodeInspection]]:
    """Run every allowed command on every node (in parallel) and interpret the answers."""
    if remote is run_remote:
        require_ssh()
    per_call = timeout if timeout is not None else fleet.timeout
    cancel = runner.Deadline(None, phase="fleet inspect")
    started = utc_iso(clock())

    def one(node: Node, command: str) -> tuple[RemoteResult, str]:
        res = _send(node, command, fleet, per_call, cancel, remote)
        if on_done:
            on_done(node.name, command)
        return res, utc_iso(clock())

    answers: dict[str, dict[str, tuple[RemoteResult, str]]] = {n.name: {} for n in nodes}
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(nodes) * len(ALLOWED_COMMANDS)))) as pool:
        futs = {(n.name, c): pool.submit(one, n, c) for n in nodes for c in ALLOWED_COMMANDS}
        try:
            for (name, cmd), fut in futs.items():
                answers[name][cmd] = fut.result()
        except KeyboardInterrupt:
            cancel.reset(0, "interrupted")
            for f in futs.values():
                f.exception()
            raise Interrupted("inspect interrupted; every ssh call was stopped") from None
    return started, [interpret(n, answers[n.name]) for n in nodes]


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB"


class _Answers:
    """One node's answers, read into ``out``: a failed, missing or unparsable command is a
    skipped item naming it (and the command), never an exception."""

    def __init__(self, out: NodeInspection, answers: dict[str, tuple[RemoteResult, str]]) -> None:
        self.out, self.answers = out, answers

    def get(self, cmd: str) -> RemoteResult:
        return self.answers[cmd][0]

    def usable(self, item: str, cmd: str, *, allow_rc: tuple[int, ...] = (0,)) -> RemoteResult | None:
        out, res = self.out, self.get(cmd)
        if res.error:
            out.skip(item, f"`{cmd}` {out.failed(res)}")
            return None
        missing = P.missing_command(res.returncode, "\n".join(res.stderr) or res.text)
        if missing:
            out.skip(item, f"{missing} not installed")
            return None
        if res.returncode not in allow_rc:
            out.skip(item, f"`{cmd}` failed: {out.failed(res)}")
            return None
        return res

    def parsed(self, item: str, cmd: str, fn: Callable[[str, list[str]], Any]) -> Any:
        noise: list[str] = []
        try:
            value = fn(self.get(cmd).text, noise)
            if noise:
                self.out.ignored_output.append({"command": cmd, "lines": noise})
            return value
        except P.ParseError as exc:
            self.out.skip(item, f"could not parse `{cmd}` output: {exc}")
            self.out.failed_commands.append({"command": cmd, "why": f"unparsable output: {exc}"})
            return None

    def read(
        self, item: str, cmd: str, fn: Callable[[str, list[str]], Any], *, allow_rc: tuple[int, ...] = (0,)
    ) -> Any:
        """The parsed answer of a usable command, else None (the item skipped with the reason)."""
        return self.parsed(item, cmd, fn) if self.usable(item, cmd, allow_rc=allow_rc) is not None else None


def interpret(node: Node, answers: dict[str, tuple[RemoteResult, str]]) -> NodeInspection:
    out = NodeInspection(node.name, node.role)
    times = []
    for cmd in ALLOWED_COMMANDS:
        res, at = answers[cmd]
        out.commands.append({"command": cmd, "returncode": res.returncode, "duration_s": round(res.duration_s, 3)})
        if res.error is None:
            times.append(at)
    out.verified_at = max(times) if times else None
    a = _Answers(out, answers)

    unreachable = all(a.get(c).error in ("unreachable", "timeout", "ssh-missing") for c in ALLOWED_COMMANDS)
    if unreachable:
        why = a.get(DATE).why()
        out.failed(a.get(DATE))
        out.skip("everything", f"node not reached: {why}")
        return out

    if (r := a.usable("node clock", DATE)) is not None:
        stamps = [ln.strip() for ln in r.lines if _ISO.match(ln.strip())]
        out.node_clock = stamps[-1] if stamps else None
        if out.node_clock is None:
            out.skip("node clock", f"`{DATE}` printed no UTC time")

    _memory(node, out, a.read("memory", FREE, lambda t, _n: P.parse_free(t)))

    if (devs := a.read("swap devices", SWAPON, P.parse_swapon)) is not None:
        out.verified.setdefault("swap", {})["devices"] = [d.__dict__ for d in devs]

    if (apps := a.read("GPU compute processes", GPU_APPS_COMMAND, P.parse_compute_apps)) is not None:
        out.verified["gpu_processes"] = [
            {"pid": p.pid, "name": p.name, "used_bytes": p.used_bytes, "reported_as": p.used_raw} for p in apps
        ]

    # `systemctl is-active` exits 3 for inactive/failed: a valid answer, not a failure.
    rc = a.get(EARLYOOM).returncode
    if (state := a.read("earlyoom", EARLYOOM, lambda t, n: P.parse_is_active(t, rc, n), allow_rc=(0, 3))) is not None:
        out.verified["earlyoom"] = state

    if (addrs := a.read("IPv4 addresses", IP_BRIEF, P.parse_ip_brief)) is not None:
        out.verified["addresses"] = [x.__dict__ for x in addrs]

    if (links := a.read("RDMA links", RDMA, P.parse_rdma_links)) is not None:
        out.verified["rdma_links"] = [rl.__dict__ for rl in links]

    _fabric(node, out, a.get(PORTS))
    return out


def _memory(node: Node, out: NodeInspection, mem: P.Memory | None) -> None:
    """RAM, swap totals and this node's budget (available less its reserve), from `free -b`."""
    if mem is None:
        out.skip("budget", "memory not verified")
        return
    out.verified["memory"] = {
        "total_bytes": mem.total,
        "used_bytes": mem.used,
        "available_bytes": mem.available,
        "capacity_bytes": mem.available,  # available RAM IS the capacity; no GPU figure added
    }
    out.verified["swap"] = {"total_bytes": mem.swap_total, "used_bytes": mem.swap_used}
    out.verified["budget"] = {
        "available_bytes": mem.available,
        "reserve_bytes": node.reserve_bytes,
        "budget_bytes": mem.available - node.reserve_bytes,
        "note": "this node only; budgets are never summed across nodes",
    }


def _fabric(node: Node, out: NodeInspection, res: RemoteResult) -> None:
    if not node.links:
        out.skip("fabric ports", "no fabric links configured for this node in the fleet file")
        return
    if res.error:
        out.skip("fabric ports", f"`{PORTS}` {out.failed(res)}")
        return
    # grep exits 2 when some attribute is unreadable (down links): the rest is still valid.
    if res.returncode not in (0, 2):
        out.skip("fabric ports", f"`{PORTS}` failed: {out.failed(res)}")
        return
    noise: list[str] = []
    try:
        ports = P.parse_port_attrs(res.text, noise)
        if noise:
            out.ignored_output.append({"command": PORTS, "lines": noise})
    except P.ParseError as exc:
        out.skip("fabric ports", f"could not parse sysfs output: {exc}")
        return
    rows = []
    for link in node.links:
        p = ports.get(link.iface)
        row: dict[str, Any] = {"iface": link.iface, "expected_speed": link.speed, "peer": link.peer}
        if p is None:
            row.update(present=False, problem="absent from /sys/class/net (a NIC without link may power down and "
                       "vanish from the bus: not proof the hardware is gone)")  # fmt: skip
        else:
            row.update(present=True, carrier=p.carrier, speed=p.speed, operstate=p.operstate, errors=p.errors or [])
            problems = []
            if p.carrier is None:
                problems.append("carrier unreadable (interface administratively down)")
            elif not p.carrier:
                problems.append("no carrier")
            if link.speed is not None and p.speed is not None and p.speed != link.speed:
                problems.append(f"negotiated {p.speed} Mb/s, expected {link.speed} Mb/s")
            elif link.speed is not None and p.speed is None and p.carrier:
                problems.append("speed not reported by the driver")
            row["problem"] = "; ".join(problems) or None
        rows.append(row)
    out.verified["fabric"] = rows


# ---- rendering -----------------------------------------------------------------------------


def to_json(started: str, nodes: list[NodeInspection]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "time": started,
        "read_only_commands": list(ALLOWED_COMMANDS),
        "nodes": [n.to_dict() for n in nodes],
    }


# What can open Markdown inline syntax mid-line: code spans, emphasis, links and images
# ("[" / "!["), raw HTML and autolinks ("<"), table cells ("|"), strikethrough ("~").
_MD_PUNCT = frozenset("\\`*_[<>!|~")


def _cell(v: Any) -> str:
    """Node text as Markdown TEXT: no terminal escapes (one sanitizer), and every ASCII
    punctuation character backslash-escaped (CommonMark allows it for all of them), so no
    node can open a code span, a link, an image or raw HTML, or end a table cell."""
    return "".join("\\" + ch if ch in _MD_PUNCT else ch for ch in T.terminal(v))


def _code(v: Any, *, in_table: bool = False) -> str:
    """Node text as a Markdown code span whose fence no backtick inside can close: one
    backtick more than the longest run in the text, padded when the text touches a
    backtick. In a GFM table a '|' still ends the cell inside a span: escaped there."""
    text = T.terminal(v)
    if in_table:
        text = text.replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith(("`", " ")) or text.endswith(("`", " ")) or not text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def to_markdown(started: str, nodes: list[NodeInspection]) -> str:
    lines = [
        f"# Fleet inspection, {started}",
        "",
        "Read-only snapshot (`alma fleet inspect`): only the commands listed at the end were sent, "
        "none changes a node. Capacity is *available* RAM; GPU allocations are never added to it. "
        "Budgets are per node and are **never summed** across nodes.",
        "",
    ]
    for n in nodes:
        lines += [f"## {n.name} ({n.role})", ""]
        v = n.verified
        if v:
            clock = f" (node clock {_cell(n.node_clock)})" if n.node_clock else ""
            lines += [f"### Verified live at {n.verified_at}{clock}", ""]
            lines += ["| item | value | source |", "|---|---|---|"]
            if "memory" in v:
                m = v["memory"]
                lines.append(f"| available memory (capacity) | {_gib(m['available_bytes'])} "
                             f"({m['available_bytes']} B) of {_gib(m['total_bytes'])} | `{FREE}` |")  # fmt: skip
            if "budget" in v:
                b = v["budget"]
                budget = f"{_gib(b['budget_bytes'])} ({b['budget_bytes']} B), this node only"
                lines.append(f"| budget (available − reserve {_gib(b['reserve_bytes'])}) | {budget} | `{FREE}` |")
            if "swap" in v:
                s = v["swap"]
                devs = ", ".join(f"{d['name']} ({d['type']})" for d in s.get("devices", [])) or "none listed"
                lines.append(f"| swap | {_gib(s.get('total_bytes', 0))} total, {_gib(s.get('used_bytes', 0))} used; "
                             f"devices: {_cell(devs)} | `{FREE}`, `{SWAPON}` |")  # fmt: skip
            if "earlyoom" in v:
                lines.append(f"| earlyoom | {_cell(v['earlyoom'])} | `{EARLYOOM}` |")
            if "addresses" in v:
                addrs = "; ".join(
                    f"{a['iface']} {a['state']} {' '.join(a['addresses'])}".strip() for a in v["addresses"]
                )
                lines.append(f"| IPv4 addresses | {_cell(addrs)} | `{IP_BRIEF}` |")
            if "rdma_links" in v:
                rl = "; ".join(
                    f"{x['link']} {x['state']} {x['physical_state']} ({x['netdev']})" for x in v["rdma_links"]
                )
                lines.append(f"| RDMA links | {_cell(rl or 'none')} | `{RDMA}` |")
            if "gpu_processes" in v:
                gp = v["gpu_processes"]
                txt = "; ".join(
                    f"{g['name']} pid {g['pid']}: "
                    + (
                        _gib(g["used_bytes"])
                        if g["used_bytes"] is not None
                        else f"memory not reported ({g['reported_as']})"
                    )
                    for g in gp
                )
                lines.append(f"| GPU compute processes | {_cell(txt or 'none')} | `{GPU_APPS_COMMAND}` |")
            for f in v.get("fabric", []):
                if not f["present"]:
                    state = f"ABSENT: {f['problem']}"
                else:
                    speed = f"{f['speed']} Mb/s" if f["speed"] else "speed unknown"
                    carrier = {True: "carrier up", False: "NO CARRIER", None: "carrier unreadable"}[f["carrier"]]
                    exp = f" (expected {f['expected_speed']} Mb/s)" if f["expected_speed"] else ""
                    state = f"{carrier}, {speed}{exp}" + (f"; PROBLEM: {f['problem']}" if f["problem"] else "")
                lines.append(f"| fabric port {_cell(f['iface'])} | {_cell(state)} | "
                             f"{_code('/sys/class/net/' + f['iface'], in_table=True)} |")  # fmt: skip
            lines.append("")
        lines += ["### Not checked", ""]
        lines += [f"- {x['item']}: {_cell(x['reason'])}" for x in n.not_checked] or ["- nothing: every item was read"]
        lines.append("")
        if n.failed_commands:
            lines += ["### Failed commands", ""]
            lines += [f"- `{x['command']}`: {_cell(x['why'])}" for x in n.failed_commands]
            lines.append("")
        if n.ignored_output:
            lines += [
                "### Ignored output",
                "",
                "Lines not in the command's format (e.g. the login shell's rc files):",
                "",
            ]
            for x in n.ignored_output:
                lines += [f"- `{x['command']}`: " + "; ".join(_code(ln) for ln in x["lines"][:5])]
            lines.append("")
    lines += ["## Commands sent (read-only allow-list)", ""] + [f"- `{c}`" for c in ALLOWED_COMMANDS] + [""]
    return T.terminal("\n".join(lines), keep_newline=True)  # the last line of defence
