"""Per-board identity at flash time, and the board's own identity line on its console.

Naming (``alma flash --hostname``, ``--hostname-pattern 'edge-{n:02d}'``, ``--hostnames FILE``):
every name is an RFC 1123 host name label, checked here and again on the device by the
layer's hook, which refuses anything else. Each board's config goes into its own copy of the
bundle as ``flashpkg-extra/alma/board.conf``: meta-tegra's initrd-flash copies
``flashpkg-extra/`` into the flash package (``/tmp/flashpkg/flashpkg/flashpkg-extra/`` on the
device) and the flashing initrd's ``/init-extra.d`` hook writes it into the flashed rootfs
(layers/meta-alma/dynamic-layers/tegra/.../alma-board-identity). Format: docs/formats.md#board-conf.

The board, booted, prints before its login prompt::

    alma-board: name=edge-01 addr=192.0.2.7,fd00::7 hostkey=SHA256:<43 base64 chars>

Console bytes are attacker-controlled: the line is matched whole, the name must be a valid
label, each address must parse as an IP address, the fingerprint must have its exact shape;
anything else is ignored (and never echoed raw).
"""

from __future__ import annotations

import csv
import hashlib
import io
import ipaddress
import re
import string
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from almaboard.text import is_hostname

from alma import loader
from alma.errors import UserError
from alma.ground import write_atomic
from alma.sshkeys import FINGERPRINT, PublicKey, read_public_key_file

FORMAT = "alma-board/1"
CONF_REL = Path("flashpkg-extra") / "alma" / "board.conf"
DEVICE_CONF = "/tmp/flashpkg/flashpkg/flashpkg-extra/alma/board.conf"
MAX_CSV_BYTES = 1 << 20
MAX_LINE = 512
MAX_IDENTITIES = 3  # distinct identity lines named in an "ambiguous" reason
_INSTANCE = re.compile(r"^\d{1,3}-\d{1,3}(?:\.\d{1,3}){0,6}$")
_BOARD_LINE = re.compile(r"^alma-board: name=(?P<name>\S{1,63}) addr=(?P<addr>\S{0,200}) hostkey=(?P<key>\S{1,60})$")
_PATTERN_SPEC = re.compile(r"^0?[1-9]?d$|^$")


def check_hostname(name: str, where: str = "--hostname") -> str:
    """An RFC 1123 label (1-63 of A-Z a-z 0-9 '-', no hyphen at either end, not all digits)."""
    if not is_hostname(name):
        shown = ascii(name)[:80]
        raise UserError(
            f"{where}: {shown} is not a host name: use 1-63 letters, digits and '-' "
            "(RFC 1123; no '-' at either end, not only digits, no dots, spaces or other characters)",
            hint="alma flash --hostname edge-01",
        )
    return name


@dataclass(frozen=True)
class BoardIdentity:
    hostname: str
    admin_key: PublicKey | None = None

    def conf_text(self) -> str:
        lines = ["# alma flash: this board's identity (docs/formats.md#board-conf)", f"FORMAT={FORMAT}",
                 f"HOSTNAME={self.hostname}"]  # fmt: skip
        if self.admin_key is not None:
            lines.append(f"ADMIN_KEY={self.admin_key.type} {self.admin_key.blob_b64}")
        return "\n".join(lines) + "\n"

    def to_record(self) -> dict[str, Any]:
        return {
            "hostname": self.hostname,
            "admin_key": self.admin_key.fingerprint if self.admin_key else None,
            "config": str(CONF_REL),
            "config_sha256": hashlib.sha256(self.conf_text().encode()).hexdigest(),
        }


def _check_pattern(pattern: str) -> None:
    """Only ``{n}`` / ``{n:02d}``-style fields: str.format would otherwise reach attributes."""
    try:
        fields = list(string.Formatter().parse(pattern))
    except ValueError as exc:
        raise UserError(f"--hostname-pattern {pattern!r}: {exc}", hint="--hostname-pattern 'edge-{n:02d}'") from None
    names = [(f, spec, conv) for _, f, spec, conv in fields if f is not None]
    if not names or any(f != "n" or conv or not _PATTERN_SPEC.fullmatch(spec or "") for f, spec, conv in names):
        raise UserError(
            f"--hostname-pattern {pattern!r}: the only field allowed is {{n}} (the board's number), "
            "optionally zero-padded like {n:02d}",
            hint="--hostname-pattern 'edge-{n:02d}'",
        )


def read_hostname_csv(path: Path) -> dict[str, str]:
    """``usb_instance,hostname`` rows (a header row ``usb_instance,hostname`` is allowed)."""
    text = loader.read_text(
        path, what="--hostnames CSV", hint="a UTF-8 CSV of USB_INSTANCE,HOSTNAME rows", max_bytes=MAX_CSV_BYTES
    )
    out: dict[str, str] = {}
    for no, row in enumerate(csv.reader(io.StringIO(text)), 1):
        cells = [c.strip() for c in row]
        if not cells or all(not c for c in cells) or cells[0].startswith("#"):
            continue
        if no == 1 and [c.lower() for c in cells] == ["usb_instance", "hostname"]:
            continue
        if len(cells) != 2 or not _INSTANCE.fullmatch(cells[0]):
            raise UserError(
                f"--hostnames {path}:{no}: want 'USB_INSTANCE,HOSTNAME' (e.g. 1-8.4,edge-01)",
                hint="alma boards lists the USB instances",
            )
        name = check_hostname(cells[1], f"--hostnames {path}:{no}")
        if cells[0] in out:
            raise UserError(f"--hostnames {path}:{no}: USB instance {cells[0]} is listed twice")
        out[cells[0]] = name
    if not out:
        raise UserError(f"--hostnames {path}: no 'USB_INSTANCE,HOSTNAME' rows")
    return out


@dataclass
class IdentityPlan:
    """How the boards of one ``alma flash`` are named; ``bind`` fixes each board's identity."""

    hostname: str | None = None
    pattern: str | None = None
    table: dict[str, str] | None = None
    admin_key: PublicKey | None = None
    assigned: dict[str, BoardIdentity] = field(default_factory=dict)

    @classmethod
    def from_options(
        cls, hostname: str | None, pattern: str | None, csv_path: Path | None, admin_key: Path | None
    ) -> IdentityPlan | None:
        given = [o for o, v in (("--hostname", hostname), ("--hostname-pattern", pattern),
                                ("--hostnames", csv_path)) if v is not None]  # fmt: skip
        if len(given) > 1:
            raise UserError(f"{' and '.join(given)} exclude each other", hint="name the boards one way")
        key = read_public_key_file(admin_key) if admin_key is not None else None
        if not given:
            if key is not None:
                raise UserError(
                    "--admin-key needs a board name to go with it", hint="alma flash --hostname edge-01 --admin-key K"
                )
            return None
        if hostname is not None:
            check_hostname(hostname)
        if pattern is not None:
            _check_pattern(pattern)
        table = read_hostname_csv(csv_path) if csv_path is not None else None
        return cls(hostname=hostname, pattern=pattern, table=table, admin_key=key)

    def bind(self, usb_instances: Iterable[str]) -> dict[str, BoardIdentity]:
        """Name every board (numbered 1.. in USB-instance order for a pattern). Raises before
        any board is touched when a name repeats or a board has none."""
        boards = sorted(usb_instances, key=_instance_key)
        names: dict[str, str] = {}
        if self.hostname is not None:
            if len(boards) > 1:
                raise UserError(
                    f"--hostname {self.hostname} for {len(boards)} boards: every board would get the same name",
                    hint="--all --hostname-pattern 'edge-{n:02d}', or --hostnames boards.csv",
                )
            names = {b: self.hostname for b in boards}
        elif self.pattern is not None:
            for n, b in enumerate(boards, 1):
                names[b] = check_hostname(self.pattern.format(n=n), f"--hostname-pattern {self.pattern!r} (n={n})")
        elif self.table is not None:
            missing = [b for b in boards if b not in self.table]
            if missing:
                raise UserError(
                    f"--hostnames: no name for the board(s) at USB {', '.join(missing)}",
                    hint="add a row 'USB_INSTANCE,HOSTNAME' for each (alma boards lists them)",
                )
            names = {b: self.table[b] for b in boards}
        seen: dict[str, str] = {}
        for b, name in names.items():
            if name.lower() in seen:
                raise UserError(f"boards {seen[name.lower()]} and {b} would both be named {name}")
            seen[name.lower()] = b
        self.assigned = {b: BoardIdentity(n, self.admin_key) for b, n in names.items()}
        return self.assigned


def _instance_key(inst: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.split(r"[-.]", inst) if x.isdigit())


def write_board_config(board_dir: Path, ident: BoardIdentity) -> Path:
    """Put ``flashpkg-extra/alma/board.conf`` into one board's bundle copy, and nothing else.

    Refuses a copy whose ``flashpkg-extra`` is not a plain directory of ours (a bundle that
    brought its own, or a link out of the copy). The file is written by rename, so a
    hard-linked payload shared with other boards' copies is never written through.
    """
    extra = board_dir / CONF_REL.parts[0]
    for p in (extra, extra / CONF_REL.parts[1]):
        if p.is_symlink() or (p.exists() and not p.is_dir()):
            raise UserError(f"{p}: the bundle copy has a {p.name} that is not a directory; refused")
    if extra.exists() and any(q != extra / "alma" for q in extra.iterdir()):
        raise UserError(
            f"{extra}: the bundle already carries flashpkg-extra files; alma flash writes the only ones",
            hint="rebuild the bundle without a flashpkg-extra directory",
        )
    target = board_dir / CONF_REL
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    write_atomic(target, ident.conf_text(), mode=0o644)
    return target


@dataclass(frozen=True)
class BoardLine:
    name: str
    addresses: tuple[str, ...]
    hostkey: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "addresses": list(self.addresses), "hostkey": self.hostkey}


def parse_board_line(line: str) -> BoardLine | None:
    """The board's ``alma-board:`` line, or None if the line is not exactly one."""
    if len(line) > MAX_LINE or not line.startswith("alma-board: "):
        return None
    m = _BOARD_LINE.fullmatch(line)
    if not m or not is_hostname(m["name"]) or not FINGERPRINT.fullmatch(m["key"]):
        return None
    addrs: list[str] = []
    for part in m["addr"].split(","):
        if not part:
            continue  # agetty prints an absent address family as nothing
        if "%" in part:
            continue  # a scope id (fe80::1%eth0) names the board's interface, not ours: never an address
        try:
            ip = ipaddress.ip_address(part)
        except ValueError:
            return None
        if ip.is_unspecified or ip.is_multicast:
            return None
        if ip.is_loopback or ip.is_link_local:
            continue  # the station's own host, or a link without its interface: never the board's address
        addrs.append(str(ip))
    return BoardLine(m["name"], tuple(addrs), m["key"])


def board_identity(lines: Iterable[str]) -> tuple[dict[str, Any] | None, str | None]:
    """The console identity policy: one boot shows exactly one distinct ``alma-board:``
    identity. Two different ones (a forged line printed before or after the real one) make
    it ambiguous: (None, why). No line at all is (None, None)."""
    distinct: list[BoardLine] = []
    for ln in lines:
        parsed = parse_board_line(ln.strip())
        if parsed is not None and parsed not in distinct:
            distinct.append(parsed)
            if len(distinct) > MAX_IDENTITIES:
                break
    if len(distinct) > 1:
        shown = "; ".join(f"name={b.name} hostkey={b.hostkey}" for b in distinct[:MAX_IDENTITIES])
        return None, (
            f"identity ambiguous: the console showed {len(distinct)} different alma-board: lines ({shown}); "
            "the board was flashed but not added to the fleet: check its host key on the board itself "
            "(ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub on its console), then "
            "alma fleet add NAME --ssh alma@ADDRESS --host-key SHA256:..."
        )
    return (distinct[0].to_dict() if distinct else None), None
