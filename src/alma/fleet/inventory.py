"""The fleet file: which nodes exist, how to reach them, what they are.

A TOML file (default ``~/.config/alma/fleet.toml``, or ``$ALMA_FLEET``)::

    [ssh]
    config = "~/.ssh/config"          # optional: passed as `ssh -F`
    strict_host_key_checking = "yes"  # yes | accept-new | no
    connect_timeout = 5

    [health]
    timeout = 20          # per node, seconds
    stale_after = 300     # a report older than this is UNKNOWN
    max_output = "1MiB"   # what one node may print per call; over it: UNKNOWN
    command = "alma-health --json"

    [panel]
    title = "ALMA-OS lab"
    stale_after = 900
    [[panel.figure]]
    label = "Boards flashed"
    value = 0

    [[node]]
    name = "orin-01"
    ssh = "orin-01"                  # an ssh destination; ~/.ssh/config applies
    role = "board"                   # board | cluster | desktop
    alias = "Edge node A"            # the only name the public panel shows
    reserve = "4GiB"                 # inspect: budget = available - reserve
    links = [{ iface = "eth1", speed = 10000 }]

Errors name the file and line (tomllib's line for syntax errors, the line of the
offending ``name =`` for semantic ones) and exit 2 through ``ConfigError``.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from almaboard import fields as F
from almaboard.config import key_lines, locator

from alma import loader
from alma.errors import ConfigError

ROLES = ("board", "cluster", "desktop")
HOST_KEY_POLICIES = ("yes", "accept-new", "no")
DEFAULT_HEALTH_COMMAND = "alma-health --json"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def default_fleet_path() -> Path:
    env = os.environ.get("ALMA_FLEET")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "alma" / "fleet.toml"


@dataclass(frozen=True)
class Link:
    iface: str
    speed: int | None = None  # Mb/s, as /sys/class/net/<if>/speed reports it
    peer: str | None = None


@dataclass(frozen=True)
class Node:
    name: str
    ssh: str
    role: str
    alias: str | None = None
    health_command: str = DEFAULT_HEALTH_COMMAND
    reserve_bytes: int = 0
    links: tuple[Link, ...] = ()
    line: int | None = None  # where the node is declared, for error messages
    host_key: str | None = None  # pinned host key (full key or SHA256:...), see fleet/join.py


@dataclass(frozen=True)
class Figure:
    label: str
    value: str  # rendered exactly as configured (0 stays "0")
    unit: str = ""


@dataclass(frozen=True)
class PanelConfig:
    title: str = "ALMA-OS fleet status"
    stale_after: float = 900.0
    figures: tuple[Figure, ...] = ()


@dataclass(frozen=True)
class SshConfig:
    config: Path | None = None
    strict_host_key_checking: str = "yes"
    connect_timeout: int = 5
    known_hosts: Path | None = None
    # >0: reuse one connection per node (ControlMaster), kept this many seconds after use,
    # as Ansible does; 0 (default): a fresh connection per call, nothing left running.
    control_persist: int = 0
    control_dir: Path | None = None


@dataclass(frozen=True)
class Fleet:
    path: Path
    nodes: tuple[Node, ...]
    ssh: SshConfig = field(default_factory=SshConfig)
    timeout: float = 20.0
    stale_after: float = 300.0
    panel: PanelConfig = field(default_factory=PanelConfig)
    max_output: int = 1 << 20  # bytes one call may print (stdout + stderr)
    alerts: tuple[Any, ...] = ()  # alma.fleet.alerts.AlertRule, from [[alert]]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise ConfigError(
            f"no node named {name!r} in {self.path}",
            hint="known nodes: " + ", ".join(n.name for n in self.nodes),
        )


def parse_size(value: Any, where: str) -> int:
    """``4GiB``/``512M``/``1073741824`` -> bytes (binary units: what `free -b` counts in)."""
    if isinstance(value, bool):
        raise ConfigError(f'{where}: expected a size like "4GiB", got {value!r}')
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            unit = (m.group(2) or "").upper()[:1]
            return int(float(m.group(1)) * _UNITS[unit if unit != "B" else ""])
    raise ConfigError(f'{where}: expected a size like "4GiB" or a byte count, got {value!r}')


class _Source:
    """Line numbers for semantic errors (tomllib only reports syntax positions), from the
    board library's one key-to-line lookup (almaboard.config.key_lines)."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = key_lines(text)
        self.where = locator(path, text)

    def node_line(self, index: int) -> int | None:
        return self.lines.get(("node", str(index + 1)))

    def key_line(self, index: int, key: str) -> int | None:
        """Line of ``key =`` inside the index-th [[node]] block (falls back to the block)."""
        return self.lines.get(("node", str(index + 1), key), self.node_line(index))

    def section_key_line(self, section: str, key: str) -> int | None:
        """Line of ``key =`` in the ``[section]`` table (None when not written there)."""
        return self.lines.get((section, key))

    def error(self, line: int | None, msg: str, hint: str | None = None) -> ConfigError:
        where = f"{self.path}:{line}" if line else str(self.path)
        return ConfigError(f"{where}: {msg}", hint=hint or f"fix {self.path} (see docs/fleet.md)")


def _str(d: dict[str, Any], key: str, src: _Source, line: int | None, default: str | None = None) -> str | None:
    v = d.get(key, default)
    if v is not None and not isinstance(v, str):
        raise src.error(line, f"{key} must be a string, got {type(v).__name__}")
    return v


def _num(d: dict[str, Any], key: str, default: float, src: _Source, what: str) -> float:
    """A positive, FINITE number of seconds: ``inf`` would never time out, ``nan`` compares
    false with everything (a ``stale_after = nan`` report is never stale). Refused with file:line."""
    if key not in d:
        return default
    return float(F.value(d[key], _SECONDS, src.where, (what.strip("[]"), key)))


_SECONDS = F.duration(above=0.0)
_ANY = F.Field(lambda v: v, "see docs/fleet.md")  # checked by its own parser below
_HEALTH_KEYS: F.Schema = {"command": _ANY, "reserve": _ANY, "timeout": _SECONDS, "stale_after": _SECONDS,
                          "max_output": _ANY}  # fmt: skip
_PANEL_KEYS: F.Schema = {"title": _ANY, "stale_after": _SECONDS, "figure": _ANY}
_SPEED = F.integer(1, 10_000_000)  # Mb/s


def _parse_links(raw: Any, src: _Source, line: int | None, name: str) -> tuple[Link, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise src.error(line, f"node {name!r}: links must be a list of {{iface, speed}} tables")
    out = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("iface"), str):
            raise src.error(line, f'node {name!r}: each link needs iface = "<interface>"')
        speed = item.get("speed")
        if speed is not None:
            try:
                speed = _SPEED(speed)
            except F.FieldError as exc:
                raise src.error(line, f"node {name!r}: link {item['iface']} speed (Mb/s) {exc.why}") from None
        peer = item.get("peer")
        out.append(Link(iface=item["iface"], speed=speed, peer=peer if isinstance(peer, str) else None))
    return tuple(out)


def _host_key(raw: dict[str, Any], src: _Source, line: int | None, name: str) -> str | None:
    from alma.sshkeys import BadKey, parse_host_key

    v = _str(raw, "host_key", src, line)
    if v is None:
        return None
    try:
        return parse_host_key(v, f"node {name!r}: host_key")
    except BadKey as exc:
        raise src.error(line, exc.message, hint='host_key = "SHA256:..." or "ssh-ed25519 AAAA..."') from None


def _parse_panel(raw: Any, src: _Source) -> PanelConfig:
    if raw is None:
        return PanelConfig()
    if not isinstance(raw, dict):
        raise src.error(None, "[panel] must be a table")
    F.check(raw, _PANEL_KEYS, src.where, prefix=("panel",))
    figures = []
    for i, fig in enumerate(raw.get("figure", []) or []):
        if not isinstance(fig, dict) or not isinstance(fig.get("label"), str) or "value" not in fig:
            raise src.error(None, f'[[panel.figure]] #{i + 1} needs label = "..." and value = ...')
        value = fig["value"]
        if isinstance(value, float) and not math.isfinite(value):
            raise src.error(None, f"[[panel.figure]] {fig['label']!r}: value must be a finite number, got {value!r}")
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise src.error(None, f"[[panel.figure]] {fig['label']!r}: value must be a number or a string")
        # Shown exactly as configured: a string keeps its formatting, 0 stays 0.
        figures.append(Figure(label=fig["label"], value=str(value), unit=str(fig.get("unit", ""))))
    title = raw.get("title", PanelConfig.title)
    if not isinstance(title, str):
        raise src.error(None, "[panel] title must be a string")
    return PanelConfig(
        title=title,
        stale_after=_num(raw, "stale_after", PanelConfig.stale_after, src, "[panel]"),
        figures=tuple(figures),
    )


def _parse_ssh(raw: Any, src: _Source, base: Path) -> SshConfig:
    if raw is None:
        return SshConfig()
    if not isinstance(raw, dict):
        raise src.error(None, "[ssh] must be a table")
    policy = raw.get("strict_host_key_checking", "yes")
    if policy not in HOST_KEY_POLICIES:
        raise src.error(None, f"[ssh] strict_host_key_checking must be one of {', '.join(HOST_KEY_POLICIES)}")

    def path(key: str) -> Path | None:
        v = raw.get(key)
        if v is None:
            return None
        if not isinstance(v, str):
            raise src.error(None, f"[ssh] {key} must be a path string")
        p = Path(v).expanduser()
        return p if p.is_absolute() else base / p

    ct = F.value(raw.get("connect_timeout", 5), F.integer(1, 3600), src.where, ("ssh", "connect_timeout"),
                 hint="connect_timeout is whole seconds")  # fmt: skip
    cp = F.value(raw.get("control_persist", 0), F.integer(0, 7 * 86400), src.where, ("ssh", "control_persist"),
                 hint="control_persist is whole seconds (0 = off)")  # fmt: skip
    unknown = sorted(set(raw) - {"config", "strict_host_key_checking", "connect_timeout", "known_hosts",
                                 "control_persist", "control_dir"})  # fmt: skip
    if unknown:
        raise src.error(None, f"[ssh] unknown key(s): {', '.join(unknown)}")
    return SshConfig(
        config=path("config"),
        strict_host_key_checking=policy,
        connect_timeout=ct,
        known_hosts=path("known_hosts"),
        control_persist=cp,
        control_dir=path("control_dir"),
    )


def parse_fleet(text: str, path: Path) -> Fleet:
    src = _Source(path, text)
    # a syntax error names tomllib's line (file:line:); deep nesting is refused too
    data = loader.loads_toml(text, path, hint=f"fix the TOML syntax in {path}", label="invalid TOML")

    known_top = {"ssh", "health", "panel", "node", "alert"}
    unknown = sorted(set(data) - known_top)
    if unknown:
        raise src.error(
            None, f"unknown section(s): {', '.join(unknown)}", hint="allowed: " + ", ".join(sorted(known_top))
        )
    health = data.get("health", {}) or {}
    if not isinstance(health, dict):
        raise src.error(None, "[health] must be a table")
    F.check(health, _HEALTH_KEYS, src.where, prefix=("health",))  # a typo'd key is refused, not ignored
    default_cmd = health.get("command", DEFAULT_HEALTH_COMMAND)
    if not isinstance(default_cmd, str) or not default_cmd.strip():
        raise src.error(None, "[health] command must be a non-empty string")
    default_reserve = parse_size(health.get("reserve", 0), f"{path}: [health] reserve")

    raw_nodes = data.get("node", [])
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise src.error(
            None, "no [[node]] entries", hint=f"add at least one [[node]] with name, ssh and role to {path}"
        )
    nodes: list[Node] = []
    seen: dict[str, int | None] = {}
    aliases: dict[str, int | None] = {}
    for i, raw in enumerate(raw_nodes):
        nodes.append(_parse_node(i, raw, src, default_cmd, default_reserve, seen, aliases))
    return Fleet(
        path=path,
        nodes=tuple(nodes),
        ssh=_parse_ssh(data.get("ssh"), src, path.parent),
        timeout=_num(health, "timeout", 20.0, src, "[health]"),
        stale_after=_num(health, "stale_after", 300.0, src, "[health]"),
        panel=_parse_panel(data.get("panel"), src),
        max_output=_max_output(health, src),
        alerts=_alerts(data.get("alert"), src),
    )


def _parse_node(
    i: int,
    raw: Any,
    src: _Source,
    default_cmd: str,
    default_reserve: int,
    seen: dict[str, int | None],
    aliases: dict[str, int | None],
) -> Node:
    """The ``i``-th [[node]]; ``seen`` and ``aliases`` (names and aliases so far, with their
    lines) are updated: a second node of either is refused at its line."""
    path = src.path
    line = src.node_line(i)
    name = _str(raw, "name", src, line)
    if not name:
        raise src.error(line, f"node #{i + 1} has no name")
    if not _NAME_RE.match(name):
        raise src.error(src.key_line(i, "name"), f"node name {name!r}: use letters, digits, '.', '_' or '-'")
    if name.lower() in seen:  # hostnames (and ssh's HostKeyAlias) ignore case
        first = seen[name.lower()]
        raise src.error(
            src.key_line(i, "name"),
            f"duplicate node name {name!r}" + (f" (first declared at line {first})" if first else ""),
            hint="give every [[node]] a unique name",
        )
    seen[name.lower()] = src.key_line(i, "name")
    role = _str(raw, "role", src, line)
    if role not in ROLES:
        raise src.error(
            src.key_line(i, "role"),
            f"node {name!r}: unknown role {role!r}" if role is not None else f"node {name!r} has no role",
            hint="role must be one of: " + ", ".join(ROLES),
        )
    dest = _str(raw, "ssh", src, line, default=name) or name
    if dest.startswith("-"):
        # Would be parsed by ssh as an option.
        raise src.error(src.key_line(i, "ssh"), f"node {name!r}: ssh destination may not start with '-'")
    cmd = _str(raw, "health_command", src, line, default=default_cmd) or default_cmd
    alias = _str(raw, "alias", src, line)
    if alias is not None:  # the public panel's and /metrics' node identity: one node each
        key = " ".join(alias.split()).casefold()
        if key in aliases:
            first = aliases[key]
            where = f" at line {first}" if first else ""
            raise src.error(src.key_line(i, "alias"), f"node {name!r}: alias {alias!r} is already used{where}",
                            hint="give every node its own alias: the panel tells nodes apart by it")  # fmt: skip
        aliases[key] = src.key_line(i, "alias")
    unknown_keys = sorted(set(raw) - {"name", "ssh", "role", "alias", "health_command", "reserve", "links", "host_key"})
    if unknown_keys:
        raise src.error(line, f"node {name!r}: unknown key(s) {', '.join(unknown_keys)}")
    return Node(
        name=name,
        ssh=dest,
        role=role,
        alias=alias,
        health_command=cmd,
        reserve_bytes=parse_size(raw.get("reserve", default_reserve), f"{path}:{line}: node {name!r} reserve")
        if "reserve" in raw
        else default_reserve,
        links=_parse_links(raw.get("links"), src, line, name),
        line=line,
        host_key=_host_key(raw, src, src.key_line(i, "host_key"), name),
    )


def _alerts(raw: Any, src: _Source) -> tuple[Any, ...]:
    from alma.fleet.alerts import parse_alerts

    line = src.lines.get(("alert", "1"))
    return parse_alerts(raw, lambda msg: src.error(line, msg), src.where)


def _max_output(health: dict[str, Any], src: _Source) -> int:
    size = parse_size(health.get("max_output", Fleet.max_output), f"{src.path}: [health] max_output")
    if not 1024 <= size <= 1 << 30:
        raise src.error(None, "[health] max_output must be between 1KiB and 1GiB",
                        hint='e.g. max_output = "1MiB" (the default)')  # fmt: skip
    return size


def load_fleet(path: Path | None = None) -> Fleet:
    p = path or default_fleet_path()
    if not p.exists():  # the first run's case: its own hint
        raise ConfigError(
            f"fleet file not found: {p}",
            hint="create it (see docs/fleet.md), or pass --fleet FILE / set ALMA_FLEET",
        )
    # the one reader of every config file: size-capped before it is read, the line of a bad byte
    return parse_fleet(loader.read_text(p, what="fleet file", max_bytes=loader.MAX_CONFIG_BYTES), p)
