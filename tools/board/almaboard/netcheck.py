"""Find network configs that bridge a fabric port (stdlib only, importable standalone).

One checker behind three callers: ``alma lint`` (src/alma/lint/fabric.py, over the layer),
the image class alma-fabric-check.bbclass (over the rootfs; bitbake loads this file by
path), and ``alma-fabric check`` on a board. It must not import anything from its package.

Flags:
- systemd-networkd: a ``.network`` (or its ``.network.d/*.conf`` drop-ins) whose
  ``[Match] Name=`` matches a fabric port and that sets ``Bridge=`` - the port becomes a
  bridge member (the bridge itself is a ``.netdev`` with ``Kind=bridge``);
- NetworkManager: a keyfile whose ``interface-name`` is a fabric port with
  ``slave-type=bridge`` / ``port-type=bridge`` (a bridge slave/port);
- ifupdown: ``bridge_ports`` / ``bridge-ports`` naming a fabric port.

Fabric ports are the ``node:port`` ends of every ``[[link]]`` in any fabric.toml found,
plus explicit names or globs (ALMA_FABRIC_PORTS).
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .config import load_layers
from .errors import ConfigError

NETWORKD_DIRS = ("etc/systemd/network", "run/systemd/network", "usr/lib/systemd/network", "lib/systemd/network")
NM_DIRS = (
    "etc/NetworkManager/system-connections",
    "usr/lib/NetworkManager/system-connections",
    "run/NetworkManager/system-connections",
)
FABRIC_FILES = ("etc/alma/fabric.toml",)


@dataclass(frozen=True)
class Hit:
    path: Path
    line: int
    message: str
    check: str = "fabric"


def fabric_ports_from(path: Path) -> set[str]:
    """Port names of every link end in a fabric description (empty if unreadable)."""
    try:
        data = load_layers(path, dropins=False).data
    except ConfigError:  # unreadable or not TOML: alma-fabric reports it; here it has no ports
        return set()
    ports = set()
    for link in data.get("link", []) if isinstance(data.get("link"), list) else []:
        if not isinstance(link, dict):
            continue
        for key in ("a", "b"):
            end = link.get(key)
            if isinstance(end, str) and ":" in end:
                ports.add(end.split(":", 1)[1])
    return ports


def _is_fabric(name: str, ports: set[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(p, name) for p in ports)


def _ini_lines(path: Path) -> list[tuple[int, str, str, str]]:
    """(line, section, key, value) of a systemd/NM style ini file; repeated keys kept."""
    out: list[tuple[int, str, str, str]] = []
    section = ""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return out
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        key, sep, val = line.partition("=")
        if sep:
            out.append((n, section, key.strip(), val.strip()))
    return out


def check_networkd(files: list[Path], ports: set[str]) -> list[Hit]:
    hits: list[Hit] = []
    bridges: dict[str, Path] = {}
    for f in files:
        if f.suffix == ".netdev":
            entries = _ini_lines(f)
            kinds = [v for _n, s, k, v in entries if s == "NetDev" and k == "Kind"]
            names = [v for _n, s, k, v in entries if s == "NetDev" and k == "Name"]
            if "bridge" in kinds:
                for name in names:
                    bridges[name] = f
    for f in files:
        if f.suffix != ".network":
            continue
        entries = _ini_lines(f)
        dropdir = f.with_name(f.name + ".d")
        if dropdir.is_dir():
            for conf in sorted(dropdir.glob("*.conf")):
                entries += [(n, s, k, v) for n, s, k, v in _ini_lines(conf)]
        match_names = [n for _l, s, k, v in entries if s == "Match" and k == "Name" for n in v.split()]
        fabric = [n for n in match_names if _is_fabric(n, ports)]
        for line, sect, key, val in entries:
            if sect == "Network" and key == "Bridge" and val and fabric:
                kind = "a bridge" if val in bridges else "bridge"
                where = f" (Kind=bridge in {bridges[val].name})" if val in bridges else ""
                hits.append(
                    Hit(
                        f,
                        line,
                        f"networkd enslaves fabric port {', '.join(fabric)} to {kind} {val}{where}; "
                        "fabric links must be routed point-to-point (no Bridge=)",
                    )
                )
    return hits


def check_nm(files: list[Path], ports: set[str]) -> list[Hit]:
    hits: list[Hit] = []
    for f in files:
        entries = _ini_lines(f)
        conn = {k: (n, v) for n, s, k, v in entries if s == "connection"}
        ifname = conn.get("interface-name", (0, ""))[1]
        for key in ("slave-type", "port-type"):
            line, val = conn.get(key, (0, ""))
            if val == "bridge" and ifname and _is_fabric(ifname, ports):
                master = conn.get("master", conn.get("controller", (0, "?")))[1]
                hits.append(
                    Hit(
                        f,
                        line,
                        f"NetworkManager makes fabric port {ifname} a bridge port of {master}; "
                        "fabric links must be routed point-to-point",
                    )
                )
    return hits


_BRIDGE_PORTS = re.compile(r"^\s*bridge[_-]ports\s+(.*)$")


def check_ifupdown(files: list[Path], ports: set[str]) -> list[Hit]:
    hits = []
    for f in files:
        try:
            lines = f.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for n, line in enumerate(lines, 1):
            m = _BRIDGE_PORTS.match(line)
            if m:
                bad = [p for p in m.group(1).split() if _is_fabric(p, ports)]
                if bad:
                    hits.append(
                        Hit(f, n, f"ifupdown bridges fabric port {', '.join(bad)}; fabric links must be routed")
                    )
    return hits


def scan_files(files: list[Path], ports: set[str]) -> list[Hit]:
    if not ports:
        return []
    nd = [f for f in files if f.suffix in (".network", ".netdev")]
    nm = [f for f in files if f.suffix == ".nmconnection" or "system-connections" in f.parts]
    ifu = [f for f in files if f.name == "interfaces" or "interfaces.d" in f.parts]
    return sorted(
        check_networkd(nd, ports) + check_nm(nm, ports) + check_ifupdown(ifu, ports),
        key=lambda h: (str(h.path), h.line),
    )


def _walk(top: Path) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if d not in (".git", "__pycache__")]
        out.extend(Path(dirpath) / n for n in filenames)
    return out


def scan_tree(top: Path, extra_ports: list[str] | None = None) -> list[Hit]:
    """Every network config anywhere under ``top`` (a layer or a source tree)."""
    files = _walk(top)
    ports = set(extra_ports or [])
    for f in files:
        if f.name == "fabric.toml":
            ports |= fabric_ports_from(f)
    return scan_files(files, ports)


def scan_rootfs(rootfs: str | os.PathLike[str], extra_ports: list[str] | None = None) -> list[Hit]:
    """The network configs of an installed root filesystem, in the places their tools read."""
    root = Path(rootfs)
    ports = set(extra_ports or [])
    for rel in FABRIC_FILES:
        ports |= fabric_ports_from(root / rel)
    files: list[Path] = []
    for rel in NETWORKD_DIRS + NM_DIRS:
        d = root / rel
        if d.is_dir():
            files.extend(p for p in _walk(d) if p.is_file() or p.is_symlink())
    for rel in ("etc/network/interfaces",):
        if (root / rel).is_file():
            files.append(root / rel)
    if (root / "etc/network/interfaces.d").is_dir():
        files.extend(_walk(root / "etc/network/interfaces.d"))
    return scan_files(files, ports)
