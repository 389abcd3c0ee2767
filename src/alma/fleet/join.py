"""A board joins the fleet: its ``[[node]]`` entry, written atomically, and its pinned host key.

After ``alma flash`` saw a board boot, the board's console line (``alma-board: name= addr=
hostkey=``, alma.flash.identity) gives everything the fleet needs: the name, where ssh
reaches it (``alma@<first address>``), and the SHA256 fingerprint of its ed25519 host key,
which came over the serial cable, not over the network, so nothing is trusted on first use.

``alma fleet health`` then connects with ``StrictHostKeyChecking=yes``, ``HostKeyAlias=<node
name>`` and a known_hosts file of alma's own holding only that node's pinned key: a full key
from the fleet file is written as is; a fingerprint is resolved once with ``ssh-keyscan`` and
kept only if the scanned key has exactly that fingerprint. A board answering with another key
finds no match, and ssh refuses it ("Host key verification failed").
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alma import runner, settings
from alma.errors import ConfigError, ToolError, UserError
from alma.flash.identity import check_hostname
from alma.fleet.inventory import ROLES, Node, SshConfig, parse_fleet
from alma.ground import write_atomic
from alma.sshkeys import FINGERPRINT, BadKey, parse_host_key, parse_public_key

ADMIN_USER = "alma"  # the image's admin user (alma.imagebuild.access)
KEYSCAN_TIMEOUT_S = 5
_DEST = re.compile(r"^(?:[A-Za-z0-9._-]{1,32}@)?(?:[A-Za-z0-9._-]{1,253}|[0-9A-Fa-f:.]{2,45})$")
_ALIAS = re.compile(r"^[^\x00-\x1f\x7f\"\\]{1,64}$")


@dataclass(frozen=True)
class NodeEntry:
    name: str
    ssh: str
    role: str = "board"
    host_key: str | None = None
    alias: str | None = None

    def toml(self) -> str:
        lines = ["[[node]]", f'name = "{self.name}"', f'ssh = "{self.ssh}"', f'role = "{self.role}"']
        if self.alias is not None:
            lines.append(f'alias = "{self.alias}"')
        if self.host_key is not None:
            lines.append(f'host_key = "{self.host_key}"')
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ssh": self.ssh, "role": self.role, "alias": self.alias, "host_key": self.host_key}


def make_entry(
    name: str, ssh: str, *, role: str = "board", host_key: str | None = None, alias: str | None = None
) -> NodeEntry:
    """Validate like the fleet loader does (and stricter: the text goes into TOML verbatim)."""
    check_hostname(name, "node name")
    if not _DEST.fullmatch(ssh) or ssh.startswith("-"):
        raise UserError(
            f"--ssh {ascii(ssh)[:80]}: not an ssh destination ([user@]host or an IP address)",
            hint="alma fleet add edge-01 --ssh alma@192.0.2.7",
        )
    if role not in ROLES:
        raise UserError(f"--role {role!r}: must be one of {', '.join(ROLES)}")
    if alias is not None and not _ALIAS.fullmatch(alias):
        raise UserError("--alias: 1-64 printable characters, no quotes or backslashes")
    key = parse_host_key(host_key, "--host-key") if host_key is not None else None
    return NodeEntry(name=name, ssh=ssh, role=role, host_key=key, alias=alias)


def entry_from_record(rec: Any, user: str = ADMIN_USER) -> tuple[NodeEntry | None, str]:
    """The entry for a flash record whose board was seen booting, or None and why not."""
    boot = rec.boot
    if not rec.booted or boot is None:
        return None, "the board was not seen booting"
    line = boot.board
    if not line:
        return None, "no 'alma-board:' line on the console (is alma-board-issue.service in the image?)"
    wanted = (rec.identity or {}).get("hostname")
    if wanted and line["name"] != wanted:
        return None, (
            f"the board calls itself {line['name']}, not {wanted}: the flash-time hook did not apply "
            "(see the device logs in the flash record)"
        )
    addrs = line.get("addresses") or []
    if not addrs:
        return None, "the board printed no address (no network yet?): add it with alma fleet add once it has one"
    entry = make_entry(line["name"], f"{user}@{addrs[0]}", host_key=line["hostkey"])
    return entry, "seen booting"


def add_to_fleet(path: Path, entry: NodeEntry) -> None:
    """Append ``entry`` to the fleet file atomically; the result must load like any fleet file."""
    try:
        text = path.read_text(encoding="utf-8") if path.exists() else ""
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read fleet file {path}: {exc}") from exc
    if text.strip():
        try:  # a new fleet file may hold only [ssh]/[health] settings and no node yet
            current = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}", hint=f"fix the TOML syntax in {path}") from exc
        nodes = current.get("node", [])
        if isinstance(nodes, list) and any(isinstance(n, dict) and n.get("name") == entry.name for n in nodes):
            raise UserError(
                f"{path}: a node named {entry.name} is already in the fleet",
                hint=f"edit or remove its [[node]] entry in {path} first (a reflashed board has a new host key)",
            )
    new = (text.rstrip("\n") + "\n\n" if text.strip() else "") + entry.toml()
    parse_fleet(new, path)  # never write a file the loader would refuse
    try:
        write_atomic(path, new)
    except OSError as exc:
        raise UserError(
            f"cannot write fleet file {path}: {exc.strerror}", hint="check the directory's permissions"
        ) from None


# -- pinned host keys for ssh ---------------------------------------------------------------


def _pin_dir(cfg: SshConfig) -> Path:
    base = cfg.control_dir or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "alma" / "ssh"
    d = base / "pinned"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


def _ssh_target(node: Node, cfg: SshConfig) -> tuple[str, str]:
    """(hostname, port) ssh would use for the node (``ssh -G`` applies ~/.ssh/config)."""
    argv = [settings.tool("ssh"), *(["-F", str(cfg.config)] if cfg.config else []), "-G", "--", node.ssh]
    res = runner.capture(argv, timeout=10, check=False)
    conf = dict(ln.split(" ", 1) for ln in res.lines if " " in ln)
    return conf.get("hostname", node.ssh.rsplit("@", 1)[-1]), conf.get("port", "22")


def scan_host_keys(node: Node, cfg: SshConfig) -> list[str]:
    """``<type> <base64>`` of every host key the node offers (ssh-keyscan, bounded)."""
    host, port = _ssh_target(node, cfg)
    argv = [
        settings.tool("ssh-keyscan"),
        "-T",
        str(KEYSCAN_TIMEOUT_S),
        "-p",
        port,
        "-t",
        "ed25519,ecdsa,rsa",
        "--",
        host,
    ]
    try:
        res = runner.capture(argv, timeout=KEYSCAN_TIMEOUT_S * 3 + 5, check=False, stderr="separate")
    except ToolError:
        return []
    keys = []
    for ln in res.lines:
        parts = ln.split()
        if len(parts) >= 3 and not ln.startswith("#"):
            try:
                k = parse_public_key(" ".join(parts[1:3]))
            except BadKey:
                continue
            keys.append(f"{k.type} {k.blob_b64}")
    return keys


def _fingerprint(key: str) -> str:
    return parse_public_key(key).fingerprint


def pinned_known_hosts(node: Node, cfg: SshConfig, scan: Any = scan_host_keys) -> Path:
    """A known_hosts file holding only ``node``'s pinned key under its name (HostKeyAlias)."""
    assert node.host_key is not None
    path = _pin_dir(cfg) / f"{node.name}.known_hosts"
    if FINGERPRINT.fullmatch(node.host_key):
        key = None
        if path.exists():  # resolved before: reuse while it still has the pinned fingerprint
            old = path.read_text(encoding="utf-8", errors="replace").split(None, 1)
            if len(old) == 2 and _safe_fp(old[1]) == node.host_key:
                key = old[1].strip()
        if key is None:
            key = next((k for k in scan(node, cfg) if _fingerprint(k) == node.host_key), None)
    else:
        key = node.host_key
    write_atomic(path, f"{node.name} {key}\n" if key else "", mode=0o600)
    return path


def _safe_fp(key: str) -> str | None:
    try:
        return _fingerprint(key.strip())
    except BadKey:
        return None


def pinned_ssh_options(node: Node, cfg: SshConfig) -> list[str]:
    """ssh options for a node with a pinned host key (first on the command line: ssh keeps
    the first value of an option, so these beat the fleet's and ~/.ssh/config's)."""
    if node.host_key is None:
        return []
    try:
        known = pinned_known_hosts(node, cfg)
    except OSError:
        known = Path("/dev/null")  # cannot keep the pin: fail closed, ssh then knows no key at all
    return [
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={known}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", f"HostKeyAlias={node.name}",
        "-o", "UpdateHostKeys=no",
    ]  # fmt: skip


def after_flash(records: list[Any], fleet_file: Path | None, user: str = ADMIN_USER) -> list[dict[str, Any]]:
    """One result per flashed board: its entry (added to ``fleet_file`` when given) or why not."""
    out: list[dict[str, Any]] = []
    for rec in records:
        if rec.result != "SUCCESS" or rec.boot is None:
            continue  # not flashed, or no console watched: nothing is known about the boot
        entry, why = entry_from_record(rec, user)
        item: dict[str, Any] = {"usb_instance": rec.board.get("usb_instance"), "entry": None, "reason": why}
        if entry is not None:
            item["entry"] = entry.to_dict()
            item["toml"] = entry.toml()
            if fleet_file is not None:
                try:
                    add_to_fleet(fleet_file, entry)
                    item["added_to"] = str(fleet_file)
                except UserError as exc:
                    item["reason"] = f"not added to {fleet_file}: {exc.message}"
        out.append(item)
    return out
