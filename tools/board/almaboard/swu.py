"""The one ``.swu`` reader and allowlist: the desktop (``alma update``, ``alma verify``) and the
board's OTA agent read an update with this module, so they cannot disagree about what it is.

A ``.swu`` is a cpio archive. meta-swupdate's class writes it with ``cpio -ov -H crc``
(classes-recipe/swupdate-common.bbclass: magic ``070702``, each header's check field the sum
of the member's data bytes, modulo 2**32); other writers use ``newc`` (``070701``, check 0).
Both are read. Members, in order: ``sw-description`` (first, as SWUpdate requires),
``sw-description.sig`` when signed (second: the bbclass writes it there), then exactly the
images the description lists: an unlisted member is refused (nothing rides along unread).

The description is JSON (SWUpdate parses it when libconfig does not), without duplicate
keys, and may ask SWUpdate for nothing but slot images::

    {"software": {"version": "...", "description": "...", "hardware-compatibility": ["1.0"],
                  "alma": {"machine": ..., "lowest-bootloader": ..., "built": ...},
                  "<MACHINE>": {"alma": {"slot-a": {"images": [...]}, "slot-b": {...}}}}}

Each slot set holds one ``raw`` rootfs image written to its own partition (meta-tegra's A/B
labels APP / APP_b) and at most one ``rawfile`` capsule into the staging path; a file is
one thing in both slots (never the rootfs in one role and the capsule in another). Image
names follow :data:`NAME`. Nothing is extracted to disk. Stdlib only (it runs on the board).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from almaboard.errors import UserError

MAGICS = {b"070701": "newc", b"070702": "crc"}
HEADER_LEN = 110
TRAILER = "TRAILER!!!"
MAX_MEMBERS = 64
MAX_DESCRIPTION = 256 * 1024
MAX_SIGNATURE = 64 * 1024
DESCRIPTION = "sw-description"
SIGNATURE = "sw-description.sig"
SELECTION = "alma"  # swupdate -e alma,slot-a|slot-b
SLOTS = ("a", "b")
PARTLABEL = {"a": "APP", "b": "APP_b"}  # meta-tegra's A/B rootfs labels (flash_*_rootfs_ab.xml)
CAPSULE_STAGING = "var/lib/alma-ota/capsule/TEGRA_BL.Cap"
# A member or image name: a plain file name (no path, no control or shell characters).
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
VERSION = re.compile(r"^[0-9]+(\.[0-9]+){0,3}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20
_SW_KEYS = {"version", "description", "hardware-compatibility", "alma"}
_ALMA_KEYS = {"machine", "built", "lowest-bootloader"}
_IMAGE_KEYS = {
    "raw": {"filename", "type", "sha256", "device"},
    "rawfile": {"filename", "type", "sha256", "path", "version"},
}
_ROLE = {"raw": "rootfs", "rawfile": "capsule"}


class SwuRefused(UserError):
    """Not a ``.swu`` ALMA-OS installs (exit 2); the message says what is wrong."""


@dataclass(frozen=True)
class Member:
    name: str
    offset: int  # of the data
    size: int
    check: int | None  # crc format: the byte sum the header claims; newc: None


@dataclass(frozen=True)
class Payload:
    filename: str
    kind: str  # "rootfs" | "capsule"
    sha256: str
    size: int
    version: str | None = None


@dataclass
class Swu:
    path: Path
    format: str  # "newc" | "crc"
    members: dict[str, Member]
    description: bytes
    signature: bytes | None
    software: dict[str, Any]
    version: str
    machine: str
    hw_revision: str
    payloads: list[Payload]
    lowest_bootloader: str | None = None
    built: str | None = None
    images: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # slot -> its image entries

    @property
    def capsule(self) -> Payload | None:
        return next((p for p in self.payloads if p.kind == "capsule"), None)


def version_tuple(v: str) -> tuple[int, ...]:
    if not VERSION.fullmatch(v):
        raise SwuRefused(f"bad version {v[:40]!r}", hint="versions are 1 to 4 dot-separated numbers, e.g. 1.4.0")
    return tuple(int(x) for x in v.split("."))


def slot_target(kind: str, slot: str) -> str:
    """Where an image of ``kind`` for ``slot`` may go, relative to the board's root."""
    return f"dev/disk/by-partlabel/{PARTLABEL[slot]}" if kind == "raw" else CAPSULE_STAGING


# ---- cpio framing ---------------------------------------------------------------------------


def members(f: BinaryIO, total: int, label: object) -> tuple[str, list[Member]]:
    """The archive's format and members up to the trailer, each bounded by the file."""
    out: list[Member] = []
    fmt = ""
    pos = 0
    while True:
        if len(out) > MAX_MEMBERS:
            raise SwuRefused(f"{label}: more than {MAX_MEMBERS} members", hint="this is not an ALMA-OS .swu")
        f.seek(pos)
        head = f.read(HEADER_LEN)
        kind = MAGICS.get(head[:6]) if len(head) == HEADER_LEN else None
        if kind is None or fmt not in ("", kind):
            raise SwuRefused(
                f"{label}: not a cpio archive (newc 070701 or crc 070702) at offset {pos}",
                hint="a .swu is the cpio archive meta-swupdate writes (cpio -H crc)",
            )
        fmt = kind
        try:
            fields = [int(head[6 + 8 * i : 14 + 8 * i], 16) for i in range(13)]
        except ValueError:
            raise SwuRefused(f"{label}: bad cpio header at offset {pos}") from None
        size, namesize, check = fields[6], fields[11], fields[12]
        if not 1 < namesize <= 101:
            raise SwuRefused(f"{label}: bad member name length at offset {pos}")
        raw = f.read(namesize)
        if len(raw) != namesize or raw[-1:] != b"\0":
            raise SwuRefused(f"{label}: truncated member name at offset {pos}")
        name = raw[:-1].decode("ascii", errors="replace")
        data = pos + HEADER_LEN + namesize
        data += -data % 4
        if name == TRAILER:
            return fmt, out
        if not NAME.fullmatch(name):
            raise SwuRefused(f"{label}: member name {name!r} is not allowed", hint="names are plain file names")
        if data + size > total:
            raise SwuRefused(
                f"{label}: member {name} runs past the end of the file (truncated download?)",
                hint="copy the .swu again and compare its sha256",
            )
        if any(m.name == name for m in out):
            raise SwuRefused(f"{label}: member {name} appears twice")
        out.append(Member(name, data, size, check if fmt == "crc" else None))
        pos = data + size
        pos += -pos % 4


def _read(f: BinaryIO, m: Member) -> bytes:
    f.seek(m.offset)
    return f.read(m.size)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("a key appears twice")
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# ---- the allowlist ---------------------------------------------------------------------------


def _target_ok(im: dict[str, Any], slot: str) -> bool:
    kind = im.get("type")
    if kind not in _IMAGE_KEYS or not set(im) <= _IMAGE_KEYS[kind]:
        return False
    want = slot_target(str(kind), slot)
    return im.get("device" if kind == "raw" else "path") in (want, "/" + want)


_Images = dict[str, list[dict[str, Any]]]  # slot -> its image entries


def _software(doc: Any, label: object, names: dict[str, Member]) -> tuple[dict[str, Any], list[Payload], _Images]:
    def bad(why: str) -> SwuRefused:
        hint = "build the .swu with the ALMA-OS image (feature ota)"
        return SwuRefused(f"{label}: sw-description refused: {why}", hint=hint)

    sw = doc.get("software") if isinstance(doc, dict) else None
    if not isinstance(sw, dict):
        raise bad("no software section")
    alma, version = sw.get("alma"), sw.get("version")
    if not isinstance(alma, dict) or not isinstance(version, str):
        raise bad("no version or alma section")
    machine = alma.get("machine")
    if not isinstance(machine, str) or not NAME.fullmatch(machine):
        raise bad("no valid machine")
    if not VERSION.fullmatch(version):
        raise bad(f"bad version {version[:40]!r}")
    hw = sw.get("hardware-compatibility")
    if not isinstance(hw, list) or not hw or not all(isinstance(x, str) for x in hw):
        raise bad("no hardware-compatibility list")
    # Only what the ALMA-OS template holds: SWUpdate acts on more (scripts, files, bootenv,
    # partitions, embedded-script, other selections), and none of it may ride along.
    extra = set(sw) - _SW_KEYS - {machine}
    extra |= {f"alma.{k}" for k in set(alma) - _ALMA_KEYS}
    if extra:
        raise bad(f"sections SWUpdate would act on that ALMA-OS never writes: {', '.join(sorted(extra))[:200]}")
    for k in ("lowest-bootloader", "built"):
        if k in alma and not isinstance(alma[k], str):
            raise bad(f"alma.{k} is not a string")
    section = sw.get(machine)
    sets = section.get(SELECTION) if isinstance(section, dict) and set(section) == {SELECTION} else None
    if not isinstance(sets, dict) or set(sets) != {f"slot-{s}" for s in SLOTS}:
        raise bad(f"no slot-a/slot-b sets for {machine} (and nothing else)")
    payloads: dict[str, Payload] = {}
    chosen: dict[str, list[dict[str, Any]]] = {}
    for slot in SLOTS:
        one = sets[f"slot-{slot}"]
        images = one.get("images") if isinstance(one, dict) and set(one) == {"images"} else None
        if not isinstance(images, list) or not images or not all(isinstance(im, dict) for im in images):
            raise bad(f"slot-{slot} has no images (or more than images)")
        kinds = [im.get("type") for im in images]
        if kinds.count("raw") != 1 or kinds.count("rawfile") > 1:
            raise bad(f"slot-{slot} must hold one rootfs image and at most one capsule")
        seen: set[str] = set()
        for im in images:
            name, sha, kind = im.get("filename"), im.get("sha256"), im.get("type")
            if not _target_ok(im, slot):
                where = f"partition {PARTLABEL[slot]}" if kind == "raw" else "capsule staging path"
                raise bad(
                    f"slot-{slot} image {str(name)[:100]!r} writes outside slot {slot}'s {where} "
                    "(or has a handler or attributes ALMA-OS never writes)"
                )
            if not isinstance(name, str) or not NAME.fullmatch(name):
                raise bad(f"image name {str(name)[:100]!r} is not a plain file name")
            if name in (DESCRIPTION, SIGNATURE) or name in seen:
                raise bad(f"image {name} is listed twice in slot-{slot} (or names the description)")
            seen.add(name)
            if name not in names:
                raise bad(f"image {name!r} is not in the archive")
            if not isinstance(sha, str) or not HEX64.fullmatch(sha):
                raise bad(f"image {name} has no sha256")
            ver = im.get("version")
            role = _ROLE[str(kind)]
            if role == "capsule" and (not isinstance(ver, str) or not VERSION.fullmatch(ver)):
                raise bad(f"capsule {name} has no version")
            p = Payload(name, role, sha, names[name].size, ver if isinstance(ver, str) else None)
            if payloads.setdefault(name, p) != p:
                raise bad(f"image {name} is a different thing in the two slots (role, hash or version)")
        chosen[slot] = images
    roles = {p.kind for p in payloads.values()}
    if sum(p.kind == "rootfs" for p in payloads.values()) != 1 or roles - {"rootfs", "capsule"}:
        raise bad("the slots must share one rootfs image")
    return sw, list(payloads.values()), chosen


def read(path: Path, *, label: object = None) -> Swu:
    """Parse and check the archive and its description (no payload hashing: :func:`check_payloads`)."""
    label = path if label is None else label
    try:
        f = path.open("rb")
    except OSError as exc:
        raise SwuRefused(f"cannot read {label}: {exc.strerror}", hint="check the path") from None
    with f:
        total = path.stat().st_size
        fmt, found = members(f, total, label)
        if not found or found[0].name != DESCRIPTION:
            raise SwuRefused(f"{label}: sw-description is not the first member", hint="SWUpdate requires it first")
        d = found[0]
        if d.size > MAX_DESCRIPTION:
            raise SwuRefused(f"{label}: sw-description is {d.size} bytes (limit {MAX_DESCRIPTION})")
        desc = _read(f, d)
        names = {m.name: m for m in found}
        sig = names.get(SIGNATURE)
        if sig is not None and found[1] is not sig:
            raise SwuRefused(f"{label}: sw-description.sig is not the second member", hint="rebuild the .swu")
        if sig is not None and sig.size > MAX_SIGNATURE:
            raise SwuRefused(f"{label}: sw-description.sig is {sig.size} bytes (limit {MAX_SIGNATURE})")
        signature = _read(f, sig) if sig is not None else None
        for m, data in ((d, desc), (sig, signature)):
            if m is not None and data is not None and m.check is not None and sum(data) & 0xFFFFFFFF != m.check:
                raise SwuRefused(f"{label}: member {m.name} fails its cpio crc checksum", hint="copy the .swu again")
    try:
        doc = json.loads(desc.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise SwuRefused(f"{label}: sw-description refused: not UTF-8") from None
    except (ValueError, RecursionError) as exc:
        raise SwuRefused(
            f"{label}: sw-description refused: not valid JSON: {str(exc)[:100]}",
            hint="ALMA-OS .swu files carry a JSON sw-description",
        ) from None
    sw, payloads, chosen = _software(doc, label, names)
    listed = {p.filename for p in payloads} | {DESCRIPTION, SIGNATURE}
    unlisted = [m.name for m in found if m.name not in listed]
    if unlisted:
        raise SwuRefused(
            f"{label}: members the sw-description does not list: {', '.join(unlisted)[:200]}: refused",
            hint="a .swu carries its description, its signature and the images it lists, nothing else",
        )
    alma = sw["alma"]
    return Swu(
        path=path,
        format=fmt,
        members=names,
        description=desc,
        signature=signature,
        software=sw,
        version=sw["version"],
        machine=alma["machine"],
        hw_revision=sw["hardware-compatibility"][0],
        payloads=payloads,
        lowest_bootloader=alma.get("lowest-bootloader"),
        built=alma.get("built"),
        images=chosen,
    )


def check_payloads(swu: Swu) -> str:
    """Read the whole file once: every listed payload's sha256 against the description, and
    (crc format) every member's byte sum against its header, as the cpio format defines it
    and SWUpdate checks it ("Checksum WRONG"). The signed hash is judged first: a changed
    payload is reported as that. Returns the file's own sha256."""
    want = {p.filename: p.sha256 for p in swu.payloads}
    whole = hashlib.sha256()
    by_offset = sorted(swu.members.values(), key=lambda m: m.offset)
    with swu.path.open("rb") as f:
        pos = 0
        for m in by_offset:
            h = hashlib.sha256() if m.name in want else None
            total = 0
            if m.offset > pos:
                whole.update(f.read(m.offset - pos))
            left = m.size
            while left:
                c = f.read(min(_CHUNK, left))
                if not c:
                    raise SwuRefused(f"{swu.path}: member {m.name} is cut short")
                whole.update(c)
                if h is not None:
                    h.update(c)
                if m.check is not None:
                    total += sum(c)
                left -= len(c)
            pos = m.offset + m.size
            if h is not None and h.hexdigest() != want[m.name]:
                got = h.hexdigest()
                raise SwuRefused(
                    f"{swu.path}: payload {m.name} does not match its signed sha256 "
                    f"({got[:12]}… vs {want[m.name][:12]}…)",
                    hint="the file was altered: rebuild it",
                )
            if m.check is not None and total & 0xFFFFFFFF != m.check:
                raise SwuRefused(
                    f"{swu.path}: member {m.name} fails its cpio crc checksum "
                    f"({total & 0xFFFFFFFF:08x} vs {m.check:08x})",
                    hint="the file was altered or damaged in transfer: copy it again",
                )
        while c := f.read(_CHUNK):
            whole.update(c)
    return whole.hexdigest()
