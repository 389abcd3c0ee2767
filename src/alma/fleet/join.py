"""A board joins the fleet: its ``[[node]]`` entry, written atomically, and its pinned host key.

After ``alma flash`` saw a board boot, the board's console line (``alma-board: name= addr=
hostkey=``, alma.flash.identity) gives everything the fleet needs: the name, where ssh
reaches it (``alma@<first address>``), and the SHA256 fingerprint of its ed25519 host key,
which came over the serial cable, not over the network, so nothing is trusted on first use.

``alma fleet health`` then connects with ``StrictHostKeyChecking=yes``, ``HostKeyAlias=<node
name>``, no known_hosts file at all and ssh's ``KnownHostsCommand`` pointing at
``pinhook.py``: ssh hands it the key the server offered on this connection (however it was
reached: ProxyCommand, ProxyJump), and it vouches for that key only when its fingerprint is
the pinned one. A board answering with another key is refused ("Host key verification
failed"), and the hook's line says which key was pinned and which was offered. This needs
OpenSSH 8.5 or newer on the operator's machine (Debian 12 has 9.2).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alma import loader
from alma.errors import ConfigError, UserError
from alma.flash.identity import check_hostname
from alma.fleet.inventory import ROLES, Node, SshConfig, parse_fleet
from alma.ground import write_atomic
from alma.sshkeys import FINGERPRINT, parse_host_key, parse_public_key

ADMIN_USER = "alma"  # the image's admin user (alma.imagebuild.access)
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
    refused = []
    for addr in addrs:  # the first address ssh can be given as written (a scope id cannot)
        try:
            return make_entry(line["name"], f"{user}@{addr}", host_key=line["hostkey"]), "seen booting"
        except UserError as exc:
            refused.append(exc.message)
    return None, f"no usable address ({'; '.join(refused)[:300]}): add it with alma fleet add"


@contextmanager
def locked_fleet_file(path: Path) -> Iterator[Path]:
    """The REAL fleet file (symlinks followed), held under an exclusive flock.

    Writers replace the file atomically (a new inode), so a lock on the old inode would
    guard nothing: after taking the lock the path must still name the locked inode, else
    the lock is taken again on the new one. Readers that only load the fleet take no lock:
    they always see a whole old or a whole new file.
    """
    real = path.resolve()  # a symlinked fleet file stays a symlink; its target is updated
    for _ in range(100):
        try:
            fd = os.open(real, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise UserError(f"cannot open fleet file {real}: {exc.strerror}", hint="check its permissions") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.fstat(fd).st_ino == os.stat(real).st_ino
            except FileNotFoundError:
                same = False
            if same:
                yield real
                return
        finally:
            os.close(fd)  # closing releases the lock
    raise UserError(f"{real}: the fleet file keeps being replaced; retry")


def add_to_fleet(path: Path, entry: NodeEntry) -> None:
    """Append ``entry`` to the fleet file: read, check and write under the file's lock, so
    concurrent adds all land; the result must load like any fleet file."""
    real = path.resolve()
    existed = real.exists()
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        with locked_fleet_file(real) as locked:
            _add_locked(locked, entry)
    except BaseException:
        if not existed:  # the lock created an empty file: a failed first add leaves nothing
            with contextlib.suppress(OSError):
                if real.stat().st_size == 0:
                    real.unlink()
        raise


def _add_locked(path: Path, entry: NodeEntry) -> None:
    text = loader.read_text(path, what="fleet file", max_bytes=loader.MAX_CONFIG_BYTES)
    if text.strip():
        # a new fleet file may hold only [ssh]/[health] settings and no node yet
        current = loader.loads_toml(text, path, hint=f"fix the TOML syntax in {path}", label="invalid TOML")
        nodes = current.get("node", [])
        taken = {str(n.get("name")).lower(): n.get("name") for n in nodes if isinstance(n, dict)} if isinstance(
            nodes, list) else {}  # fmt: skip
        if entry.name.lower() in taken:
            same = taken[entry.name.lower()]
            raise UserError(
                f"{path}: a node named {same} is already in the fleet"
                + (f" (names are compared case-insensitively, as hostnames are: {entry.name})" if same != entry.name
                   else ""),  # fmt: skip
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

PIN_HOOK = Path(__file__).with_name("pinhook.py")


def ssh_quote(value: str, what: str) -> str:
    """``value`` as ONE argument of an ``-o`` option, the way ssh splits it.

    ssh splits option values on whitespace (UserKnownHostsFile takes a LIST of files) and
    expands ``%`` tokens: the value is double-quoted, ``\\`` and ``"`` escaped, ``%``
    doubled. Control characters cannot be written at all: refused.
    """
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise ConfigError(f"{what} {ascii(value)[:120]}: control characters cannot be passed to ssh",
                          hint="use a path without control characters")  # fmt: skip
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{escaped}"'


def pinned_fingerprint(node: Node) -> str | None:
    """The SHA256 fingerprint a node is pinned to (a full key pins its fingerprint)."""
    if node.host_key is None:
        return None
    if FINGERPRINT.fullmatch(node.host_key):
        return node.host_key
    return parse_public_key(node.host_key).fingerprint


def pinned_ssh_options(node: Node, cfg: SshConfig, python: str | None = None) -> list[str]:
    """ssh options for a node with a pinned host key (first on the command line: ssh keeps
    the first value of an option, so these beat the fleet's and ~/.ssh/config's).

    No known_hosts file and no ssh-keyscan: ssh itself asks ``pinhook.py`` about the key
    the server offered on this very connection (through any ProxyCommand or ProxyJump), and
    the hook vouches for it only when it has the pinned fingerprint. Nothing is kept on
    disk, so no pin file can be planted, shared between fleets or go stale.
    """
    fp = pinned_fingerprint(node)
    if fp is None:
        return []
    hook = " ".join([ssh_quote(python or sys.executable, "python"), "-I", ssh_quote(str(PIN_HOOK), "pin hook"),
                     fp, "%H", "%t", "%K"])  # fmt: skip
    return [
        "-o", "StrictHostKeyChecking=yes",
        "-o", "UserKnownHostsFile=/dev/null",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", f"KnownHostsCommand={hook}",
        "-o", f"HostKeyAlias={node.name}",
        "-o", "UpdateHostKeys=no",
        "-o", "CheckHostIP=no",
    ]  # fmt: skip


def after_flash(records: list[Any], fleet_file: Path | None, user: str = ADMIN_USER) -> list[dict[str, Any]]:
    """One result per flashed board: its entry (added to ``fleet_file`` when given) or why not."""
    out: list[dict[str, Any]] = []
    for rec in records:
        if rec.result != "SUCCESS" or rec.boot is None:
            continue  # not flashed, or no console watched: nothing is known about the boot
        try:
            entry, why = entry_from_record(rec, user)
        except UserError as exc:  # one board's odd console line never stops the others
            entry, why = None, f"not added: {exc.message}"
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
