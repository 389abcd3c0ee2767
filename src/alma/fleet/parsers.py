"""Parsers for the output of the read-only commands ``alma fleet inspect`` runs.

Each parser takes the command's text exactly as the tool prints it (tests feed recorded
real output) and returns plain data. ssh hands us the remote stderr in the same stream, and
a login shell's rc files print there too (a `pyenv init` racing with a parallel login says
"No such file or directory" in the middle of `ps` output): lines that are not in the tool's
row format are therefore set aside into ``noise`` (reported, never parsed as data), while a
line that IS a row but does not parse raises ``ParseError`` (the tool's format changed:
say "could not parse" instead of guessing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Shells say this when a command is missing: dash "sh: 1: rdma: not found",
# bash "bash: line 1: rdma: command not found"; ssh passes the shell's exit 127 on.
NOT_FOUND_EXIT = 127
_NOT_FOUND_RE = re.compile(r"(?:^|: )(?P<cmd>[\w.-]+): (?:command )?not found\s*$")


class ParseError(ValueError):
    pass


def missing_command(returncode: int | None, text: str) -> str | None:
    """The command the remote shell could not find, or None."""
    if returncode != NOT_FOUND_EXIT:
        return None
    for line in text.splitlines():
        m = _NOT_FOUND_RE.search(line.strip())
        if m:
            return m.group("cmd")
    return "?"


@dataclass
class Memory:
    total: int
    used: int
    free: int
    available: int  # the capacity: what a new job can get without swapping
    swap_total: int
    swap_used: int
    swap_free: int


def parse_free(text: str) -> Memory:
    """``free -b`` (procps-ng): a header line, ``Mem:`` and ``Swap:`` rows in bytes."""
    header: list[str] | None = None
    rows: dict[str, list[int]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "total":
            header = parts
        elif parts[0] in ("Mem:", "Swap:"):
            try:
                rows[parts[0]] = [int(p) for p in parts[1:]]
            except ValueError as exc:
                raise ParseError(f"free -b: non-numeric value in {line!r}") from exc
    if header is None or "Mem:" not in rows:
        raise ParseError("free -b: no header or no Mem: row")
    mem = dict(zip(header, rows["Mem:"], strict=False))
    if "available" not in mem:
        # procps < 3.3.10 had no "available" column; free is NOT a capacity estimate.
        raise ParseError("free -b: no 'available' column (procps too old to tell capacity)")
    swap = rows.get("Swap:", [0, 0, 0])
    return Memory(
        total=mem["total"],
        used=mem["used"],
        free=mem["free"],
        available=mem["available"],
        swap_total=swap[0],
        swap_used=swap[1] if len(swap) > 1 else 0,
        swap_free=swap[2] if len(swap) > 2 else 0,
    )


@dataclass
class GpuProcess:
    pid: int
    name: str
    used_bytes: int | None  # None: the driver reports "[N/A]" / "[Not Supported]" (Orin, GB10)
    used_raw: str


_UNREPORTED = {"[n/a]", "n/a", "[not supported]", "not supported", ""}
_MEM_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(MiB|GiB|KiB|B)$")
_MEM_UNIT = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


_APP_ROW = re.compile(r"^\d+\s*,")


def _keep(noise: list[str] | None, line: str) -> None:
    if noise is not None and line.strip():
        noise.append(line.strip())


def parse_compute_apps(text: str, noise: list[str] | None = None) -> list[GpuProcess]:
    """``nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader``.

    Rows look like ``4242, /usr/bin/python3, 1536 MiB``; on unified-memory boards the
    memory field is ``[N/A]`` (or ``[Not Supported]``): kept as unknown, never as 0.
    A process name may contain commas, so pid is the first field and memory the last.
    """
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.lower().startswith("no running"):
            continue
        if not _APP_ROW.match(line):
            _keep(noise, line)
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 3:
            raise ParseError(f"nvidia-smi: expected 'pid, process_name, used_memory', got {line!r}")
        pid_s, mem_s, name = fields[0], fields[-1], ", ".join(fields[1:-1])
        if not pid_s.isdigit():
            raise ParseError(f"nvidia-smi: pid is not a number in {line!r}")
        if mem_s.lower() in _UNREPORTED:
            used: int | None = None
        else:
            m = _MEM_RE.match(mem_s)
            if not m:
                raise ParseError(f"nvidia-smi: unexpected memory value {mem_s!r}")
            used = int(float(m.group(1)) * _MEM_UNIT[m.group(2)])
        out.append(GpuProcess(pid=int(pid_s), name=name, used_bytes=used, used_raw=mem_s))
    return out


def parse_is_active(text: str, returncode: int | None, noise: list[str] | None = None) -> str:
    """``systemctl is-active UNIT``: one word (active, inactive, failed, activating, ...)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    states = {"active", "inactive", "failed", "activating", "deactivating", "reloading", "unknown", "maintenance"}
    for ln in lines:
        if ln in states:
            for other in lines:
                if other != ln:
                    _keep(noise, other)
            return ln
    raise ParseError(lines[0] if lines else f"systemctl exited {returncode} without a state")


@dataclass
class Address:
    iface: str
    state: str
    addresses: list[str]


# Operational states as iproute2 prints them (ip/ipaddress.c oper_states).
_OPER = ("UNKNOWN", "NOTPRESENT", "DOWN", "LOWERLAYERDOWN", "TESTING", "DORMANT", "UP")


def parse_ip_brief(text: str, noise: list[str] | None = None) -> list[Address]:
    """``ip -br -4 address``: ``<ifname>[@peer] <STATE> <addr/len>...`` per line."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2 or parts[1] not in _OPER:
            _keep(noise, line)
            continue
        if not all(re.match(r"^\d{1,3}(\.\d{1,3}){3}/\d{1,2}$", a) for a in parts[2:]):
            raise ParseError(f"ip -br -4: not IPv4 prefixes in {line!r}")
        out.append(Address(iface=parts[0].split("@", 1)[0], state=parts[1], addresses=parts[2:]))
    return out


@dataclass
class RdmaLink:
    link: str  # "mlx5_0/1"
    state: str | None
    physical_state: str | None
    netdev: str | None


def parse_rdma_links(text: str, noise: list[str] | None = None) -> list[RdmaLink]:
    """``rdma link show``: ``link mlx5_0/1 state ACTIVE physical_state LINK_UP netdev enp1s0f0``."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0] != "link":
            _keep(noise, line)
            continue
        if len(parts) < 2 or "/" not in parts[1]:
            raise ParseError(f"rdma: unexpected link line {line!r}")
        kv = dict(zip(parts[2::2], parts[3::2], strict=False))
        out.append(
            RdmaLink(
                link=parts[1], state=kv.get("state"), physical_state=kv.get("physical_state"), netdev=kv.get("netdev")
            )
        )
    return out


@dataclass
class Port:
    iface: str
    carrier: bool | None = None  # None: unreadable (the kernel says EINVAL while the link is admin-down)
    speed: int | None = None  # Mb/s; None when unknown (-1, or unreadable)
    operstate: str | None = None
    errors: list[str] | None = None


_SYSFS_LINE = re.compile(r"^/sys/class/net/(?P<if>[^/]+)/(?P<attr>carrier|speed|operstate):(?P<val>.*)$")
_SYSFS_ERR = re.compile(r"^grep: /sys/class/net/(?P<if>[^/]+)/(?P<attr>carrier|speed|operstate): (?P<why>.+)$")


def parse_port_attrs(text: str, noise: list[str] | None = None) -> dict[str, Port]:
    """``grep -s -H . /sys/class/net/*/carrier /sys/class/net/*/speed /sys/class/net/*/operstate``.

    Reading ``carrier`` or ``speed`` of a down interface fails with "Invalid argument": with
    ``-s`` the line is simply absent (carrier stays None = unreadable); without ``-s`` the
    message is recorded per port. Either way it is not a missing port.
    """
    ports: dict[str, Port] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        m = _SYSFS_LINE.match(line)
        if m:
            p = ports.setdefault(m["if"], Port(m["if"]))
            val = m["val"].strip()
            if m["attr"] == "carrier":
                p.carrier = val == "1"
            elif m["attr"] == "speed":
                try:
                    sp = int(val)
                except ValueError:
                    sp = -1
                p.speed = sp if sp > 0 else None
            else:
                p.operstate = val
            continue
        e = _SYSFS_ERR.match(line)
        if e:
            p = ports.setdefault(e["if"], Port(e["if"]))
            p.errors = [*(p.errors or []), f"{e['attr']}: {e['why']}"]
            continue
        if line.startswith("grep: /sys/class/net/*"):
            continue  # no interface at all: the glob stayed literal
        _keep(noise, line)
    return ports


@dataclass
class Process:
    pid: int
    args: str

    @property
    def exe(self) -> str:
        first = self.args.split(" ", 1)[0]
        return first.rsplit("/", 1)[-1]


def parse_ps(text: str, noise: list[str] | None = None) -> list[Process]:
    """``ps -eo pid=,args=``: pid then the full command line."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        pid_s, _, args = line.partition(" ")
        if not pid_s.isdigit():
            _keep(noise, line)
            continue
        out.append(Process(int(pid_s), args.strip()))
    return out


@dataclass
class SwapDevice:
    name: str
    type: str
    size: int
    used: int
    prio: int | None


_SWAP_ROW = re.compile(r"^\S+\s+(partition|file|\S+)\s+\S+\s+\S+(\s+\S+)?$")


def parse_swapon(text: str, noise: list[str] | None = None) -> list[SwapDevice]:
    """``swapon --show --bytes --noheadings --raw``: NAME TYPE SIZE USED PRIO (empty: no swap)."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if not parts or not line.startswith("/") or not _SWAP_ROW.match(line.strip()):
            _keep(noise, line)
            continue
        try:
            prio = int(parts[4]) if len(parts) > 4 else None
            # --raw escapes blanks in names as \x20
            out.append(SwapDevice(parts[0].replace("\\x20", " "), parts[1], int(parts[2]), int(parts[3]), prio))
        except ValueError as exc:
            raise ParseError(f"swapon: non-numeric size in {line!r}") from exc
    return out
