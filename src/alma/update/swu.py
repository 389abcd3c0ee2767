"""The ``.swu`` update artefact: written by our own code, read back with bounds.

A ``.swu`` is what SWUpdate installs: a cpio archive (``newc``, magic ``070701``) whose first
member is ``sw-description``, then ``sw-description.sig`` (a detached CMS signature over it,
DER), then the payloads. SWUpdate checks the signature against the certificate baked into
the image (``swupdate -k``), then streams each payload to its target and checks the sha256
the signed description names, so a payload cannot be swapped without breaking the
signature, and a description cannot be changed without the key.

Our ``sw-description`` is JSON (SWUpdate 2022.12+ parses it when libconfig does not) so
that ``alma verify`` reads it with the one safe JSON loader. Layout::

    {"software": {"version": "...", "description": "...", "hardware-compatibility": ["1.0"],
                  "alma": {"machine": ..., "lowest-bootloader": ..., "built": ...},
                  "<MACHINE>": {"alma": {"slot-a": {"images": [...]}, "slot-b": {...}}}}}

``-H <MACHINE>:<rev>`` on the board makes SWUpdate pick the machine's section (a ``.swu``
for another machine finds nothing to install), ``-e alma,slot-b`` picks the inactive
slot's set. Rootfs images use the ``raw`` handler (the partition by its GPT label, APP /
APP_b, meta-tegra's A/B names); the bootloader capsule uses ``rawfile`` into a staging
path: the board's agent arms it only when its version differs from the running one and is
not below the lowest supported version (docs/ota.md).

Reader invariants (each attacked in tests/update/test_swu.py): at most ``MAX_MEMBERS``
members, names matching ``_NAME``, sizes within the file, ``sw-description`` first and at
most ``MAX_DESCRIPTION`` bytes; a payload named in the description must be a member and
its hash is recomputed when ``hashes=True``. Nothing is extracted to disk.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from alma.errors import UserError
from alma.ground import utc_iso
from alma.loader import loads_json

MAGIC = b"070701"
HEADER_LEN = 110
TRAILER = "TRAILER!!!"
MAX_MEMBERS = 64
MAX_DESCRIPTION = 256 * 1024
MAX_SIGNATURE = 64 * 1024
DESCRIPTION = "sw-description"
SIGNATURE = "sw-description.sig"
SELECTION = "alma"  # swupdate -e alma,slot-a|slot-b
SLOTS = ("a", "b")
# meta-tegra's A/B partition labels for the rootfs (flash_*_rootfs_ab.xml).
PARTLABEL = {"a": "APP", "b": "APP_b"}
CAPSULE_NAME = "tegra-bl.cap"
CAPSULE_STAGING = "var/lib/alma-ota/capsule/TEGRA_BL.Cap"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_VERSION = re.compile(r"^[0-9]+(\.[0-9]+){0,3}$")
_CHUNK = 1 << 20


class SwuError(UserError):
    """The file is not a ``.swu`` we can read (exit 2, with what is wrong)."""


@dataclass(frozen=True)
class Payload:
    filename: str
    kind: str  # "rootfs" | "capsule"
    sha256: str
    size: int
    version: str | None = None


@dataclass
class SwuInfo:
    path: str
    sha256: str
    size: int
    version: str
    machine: str
    hw_revision: str
    payloads: list[Payload]
    signed: bool
    signers: list[dict[str, str]] = field(default_factory=list)  # subject, sha256 fingerprint
    lowest_bootloader: str | None = None
    built: str | None = None
    hashes_checked: bool = False

    @property
    def capsule(self) -> Payload | None:
        return next((p for p in self.payloads if p.kind == "capsule"), None)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["payloads"] = [asdict(p) for p in self.payloads]
        return d


def version_tuple(v: str) -> tuple[int, ...]:
    if not _VERSION.fullmatch(v):
        raise SwuError(f"bad version {v!r}", hint="versions are 1 to 4 dot-separated numbers, e.g. 1.4.0")
    return tuple(int(x) for x in v.split("."))


# ---- writing -------------------------------------------------------------------------------


def _header(name: str, size: int, ino: int, mode: int = 0o100644) -> bytes:
    raw = name.encode() + b"\0"
    fields = [ino, mode, 0, 0, 1, 0, size, 0, 0, 0, 0, len(raw), 0]
    head = MAGIC + b"".join(b"%08X" % f for f in fields) + raw
    return head + b"\0" * (-len(head) % 4)


def _write_member(out: BinaryIO, name: str, size: int, ino: int, chunks: Iterator[bytes]) -> None:
    out.write(_header(name, size, ino))
    for c in chunks:
        out.write(c)
    out.write(b"\0" * (-size % 4))


def _file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while c := f.read(_CHUNK):
            yield c


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    for c in _file_chunks(path):
        h.update(c)
    return h.hexdigest()


def sign_detached(data: bytes, cert_pem: bytes, key_pem: bytes) -> bytes:
    """A detached CMS (PKCS#7 SignedData) signature in DER, what ``openssl cms -sign -binary
    -nosmimecap -outform DER`` writes and what SWUpdate's CMS verifier reads."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.serialization import pkcs7

    cert = x509.load_pem_x509_certificate(cert_pem)
    key = serialization.load_pem_private_key(key_pem, password=None)
    opts = [pkcs7.PKCS7Options.DetachedSignature, pkcs7.PKCS7Options.Binary, pkcs7.PKCS7Options.NoCapabilities]
    builder = pkcs7.PKCS7SignatureBuilder().set_data(data).add_signer(cert, key, hashes.SHA256())  # type: ignore[arg-type]
    return builder.sign(serialization.Encoding.DER, opts)


def description(
    *,
    machine: str,
    version: str,
    payloads: list[Payload],
    hw_revision: str = "1.0",
    root: str = "/",
    lowest_bootloader: str | None = None,
    built: str | None = None,
) -> bytes:
    """The JSON ``sw-description`` (module docstring). ``root`` prefixes every target path
    ("/" on a board; "" makes them relative, for a simulated board's directory)."""
    version_tuple(version)
    if root not in ("/", ""):
        raise SwuError(f"root {root!r}: targets are '/'-rooted (a board) or relative (a simulated board)")
    prefix = root
    sets: dict[str, Any] = {}
    for slot in SLOTS:
        images: list[dict[str, Any]] = []
        for p in payloads:
            if p.kind == "rootfs":
                images.append(
                    {
                        "filename": p.filename,
                        "type": "raw",
                        "sha256": p.sha256,
                        "device": prefix + slot_target("raw", slot),
                    }
                )
            else:
                images.append(
                    {
                        "filename": p.filename,
                        "type": "rawfile",
                        "sha256": p.sha256,
                        "path": prefix + slot_target("rawfile", slot),
                        "version": p.version,
                    }
                )
        sets[f"slot-{slot}"] = {"images": images}
    alma: dict[str, Any] = {"machine": machine, "built": built or utc_iso()}
    if lowest_bootloader:
        alma["lowest-bootloader"] = lowest_bootloader
    sw = {
        "software": {
            "version": version,
            "description": f"ALMA-OS {version} for {machine}",
            "hardware-compatibility": [hw_revision],
            "alma": alma,
            machine: {SELECTION: sets},
        }
    }
    return (json.dumps(sw, indent=2, sort_keys=True) + "\n").encode()


def build_swu(
    out: Path,
    *,
    machine: str,
    version: str,
    rootfs: Path,
    cert_pem: bytes,
    key_pem: bytes,
    capsule: Path | None = None,
    capsule_version: str | None = None,
    lowest_bootloader: str | None = None,
    hw_revision: str = "1.0",
    root: str = "/",
) -> SwuInfo:
    """Write a signed ``.swu`` atomically (``out`` appears complete or not at all)."""
    payloads = [Payload("rootfs.ext4", "rootfs", sha256_file(rootfs), rootfs.stat().st_size)]
    members = [("rootfs.ext4", rootfs)]
    if capsule is not None:
        if capsule_version is None:
            raise SwuError("a capsule needs its version", hint="pass the bootloader version the capsule carries")
        version_tuple(capsule_version)
        payloads.append(Payload(CAPSULE_NAME, "capsule", sha256_file(capsule), capsule.stat().st_size, capsule_version))
        members.append((CAPSULE_NAME, capsule))
    desc = description(
        machine=machine,
        version=version,
        payloads=payloads,
        hw_revision=hw_revision,
        root=root,
        lowest_bootloader=lowest_bootloader,
    )
    sig = sign_detached(desc, cert_pem, key_pem)
    tmp = out.with_name(f".{out.name}.part")
    with tmp.open("wb") as f:
        _write_member(f, DESCRIPTION, len(desc), 1, iter([desc]))
        _write_member(f, SIGNATURE, len(sig), 2, iter([sig]))
        for ino, (name, path) in enumerate(members, start=3):
            _write_member(f, name, path.stat().st_size, ino, _file_chunks(path))
        _write_member(f, TRAILER, 0, 0, iter(()))
        f.write(b"\0" * (-f.tell() % 512))
    tmp.replace(out)
    return read_swu(out)


# ---- reading -------------------------------------------------------------------------------


@dataclass
class _Member:
    name: str
    offset: int  # of the data
    size: int


def _members(f: BinaryIO, total: int, path: Path) -> list[_Member]:
    out: list[_Member] = []
    pos = 0
    while True:
        if len(out) > MAX_MEMBERS:
            raise SwuError(f"{path}: more than {MAX_MEMBERS} members", hint="this is not an ALMA-OS .swu")
        f.seek(pos)
        head = f.read(HEADER_LEN)
        if len(head) < HEADER_LEN or head[:6] != MAGIC:
            raise SwuError(
                f"{path}: not a cpio newc archive at offset {pos}", hint="a .swu starts with a cpio header (070701)"
            )
        try:
            fields = [int(head[6 + 8 * i : 14 + 8 * i], 16) for i in range(13)]
        except ValueError:
            raise SwuError(f"{path}: bad cpio header at offset {pos}") from None
        size, namesize = fields[6], fields[11]
        if not 1 < namesize <= 101:
            raise SwuError(f"{path}: bad member name length at offset {pos}")
        raw = f.read(namesize)
        if len(raw) != namesize or raw[-1:] != b"\0":
            raise SwuError(f"{path}: truncated member name at offset {pos}")
        name = raw[:-1].decode("ascii", errors="replace")
        data = pos + HEADER_LEN + namesize
        data += -data % 4
        if name == TRAILER:
            return out
        if not _NAME.fullmatch(name):
            raise SwuError(f"{path}: member name {name!r} is not allowed", hint="names are plain file names")
        if data + size > total:
            raise SwuError(
                f"{path}: member {name} runs past the end of the file (truncated download?)",
                hint="copy the .swu again and compare its sha256",
            )
        if any(m.name == name for m in out):
            raise SwuError(f"{path}: member {name} appears twice")
        out.append(_Member(name, data, size))
        pos = data + size
        pos += -pos % 4


def _signers(sig: bytes) -> list[dict[str, str]]:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.serialization import pkcs7

    try:
        certs = pkcs7.load_der_pkcs7_certificates(sig)
    except ValueError as exc:
        raise SwuError(f"sw-description.sig is not a CMS signature: {exc}") from None
    return [{"subject": c.subject.rfc4514_string(), "sha256": c.fingerprint(hashes.SHA256()).hex()} for c in certs]


def _hash_member(f: BinaryIO, m: _Member) -> str:
    h = hashlib.sha256()
    f.seek(m.offset)
    left = m.size
    while left:
        c = f.read(min(_CHUNK, left))
        if not c:
            break
        h.update(c)
        left -= len(c)
    return h.hexdigest()


def read_swu(path: Path, *, hashes: bool = True) -> SwuInfo:
    """What the ``.swu`` claims (and, with ``hashes``, whether its payloads match)."""
    try:
        f = path.open("rb")
    except OSError as exc:
        raise SwuError(f"cannot read {path}: {exc.strerror}", hint="check the path") from None
    with f:
        total = path.stat().st_size
        members = _members(f, total, path)
        if not members or members[0].name != DESCRIPTION:
            raise SwuError(f"{path}: sw-description is not the first member", hint="SWUpdate requires it first")
        d = members[0]
        if d.size > MAX_DESCRIPTION:
            raise SwuError(f"{path}: sw-description is {d.size} bytes (limit {MAX_DESCRIPTION})")
        f.seek(d.offset)
        raw = f.read(d.size)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise SwuError(f"{path}: sw-description is not UTF-8") from None
        try:
            doc = loads_json(text, f"{path}:sw-description", hint="ALMA-OS .swu files carry a JSON sw-description")
        except UserError as exc:
            raise SwuError(exc.message, hint=exc.hint) from None
        signers: list[dict[str, str]] = []
        by_name = {m.name: m for m in members}
        sig = by_name.get(SIGNATURE)
        if sig is not None:
            if sig.size > MAX_SIGNATURE:
                raise SwuError(f"{path}: sw-description.sig is {sig.size} bytes (limit {MAX_SIGNATURE})")
            f.seek(sig.offset)
            signers = _signers(f.read(sig.size))
        info = _info(doc, path, by_name)
        info.signed = sig is not None
        info.signers = signers
        h = hashlib.sha256()
        f.seek(0)
        while c := f.read(_CHUNK):
            h.update(c)
        info.sha256 = h.hexdigest()
        info.size = total
        if hashes:
            for p in info.payloads:
                got = _hash_member(f, by_name[p.filename])
                if got != p.sha256:
                    raise SwuError(
                        f"{path}: payload {p.filename} does not match its signed sha256 "
                        f"({got[:12]}… vs {p.sha256[:12]}…)",
                        hint="the file was altered: rebuild it",
                    )
            info.hashes_checked = True
        return info


_IMAGE_KEYS = {
    "raw": {"filename", "type", "sha256", "device"},
    "rawfile": {"filename", "type", "sha256", "path", "version"},
}


def slot_target(kind: str, slot: str) -> str:
    """Where an image of ``kind`` for ``slot`` may go, relative to the board's root."""
    return f"dev/disk/by-partlabel/{PARTLABEL[slot]}" if kind == "raw" else CAPSULE_STAGING


def _target_of(im: dict[str, Any], slot: str) -> str | None:
    """The image's target when it is exactly its slot's own (``/``-rooted or relative), else None."""
    kind = im.get("type")
    if kind not in _IMAGE_KEYS or not set(im) <= _IMAGE_KEYS[kind]:
        return None
    where = im.get("device" if kind == "raw" else "path")
    want = slot_target(kind, slot)
    return want if where in (want, "/" + want) else None


def _info(doc: Any, path: Path, members: dict[str, _Member]) -> SwuInfo:
    def bad(why: str) -> SwuError:
        return SwuError(f"{path}: sw-description: {why}", hint="build the .swu with the ALMA-OS image (feature ota)")

    sw = doc.get("software") if isinstance(doc, dict) else None
    if not isinstance(sw, dict):
        raise bad("no software section")
    alma = sw.get("alma")
    version = sw.get("version")
    if not isinstance(alma, dict) or not isinstance(version, str):
        raise bad("no version or alma section")
    machine = alma.get("machine")
    if not isinstance(machine, str) or not _NAME.fullmatch(machine):
        raise bad("no valid machine")
    try:
        version_tuple(version)
    except SwuError as exc:
        raise bad(exc.message) from None
    hw = sw.get("hardware-compatibility")
    if not isinstance(hw, list) or not hw or not all(isinstance(x, str) for x in hw):
        raise bad("no hardware-compatibility list")
    # Only what our writer puts there: SWUpdate acts on more (scripts, files, bootenv,
    # partitions, embedded-script, other selections), and none of it may ride along.
    extra = set(sw) - {"version", "description", "hardware-compatibility", "alma", machine}
    extra |= {f"alma.{k}" for k in set(alma) - {"machine", "built", "lowest-bootloader"}}
    if extra:
        raise bad(f"sections SWUpdate would act on that ALMA-OS never writes: {', '.join(sorted(extra))[:200]}")
    section = sw.get(machine)
    sets = section.get(SELECTION) if isinstance(section, dict) and set(section) == {SELECTION} else None
    if not isinstance(sets, dict) or set(sets) != {f"slot-{s}" for s in SLOTS}:
        raise bad(f"no slot-a/slot-b sets for {machine} (and nothing else)")
    payloads: dict[str, Payload] = {}
    for slot in SLOTS:
        images = sets[f"slot-{slot}"].get("images") if isinstance(sets[f"slot-{slot}"], dict) else None
        if not isinstance(images, list) or not images or set(sets[f"slot-{slot}"]) != {"images"}:
            raise bad(f"slot-{slot} has no images (or more than images)")
        kinds = [im.get("type") for im in images if isinstance(im, dict)]
        if kinds.count("raw") != 1 or kinds.count("rawfile") > 1:
            raise bad(f"slot-{slot} must hold one rootfs image and at most one capsule")
        for im in images:
            if not isinstance(im, dict):
                raise bad("an image is not a table")
            name, sha, kind = im.get("filename"), im.get("sha256"), im.get("type")
            target = _target_of(im, slot)
            if target is None:
                raise bad(
                    f"slot-{slot} image {str(name)[:100]!r} writes outside slot {slot}'s "
                    f"{'partition ' + PARTLABEL[slot] if kind == 'raw' else 'capsule staging path'} "
                    "(or carries attributes ALMA-OS never writes)"
                )
            if not isinstance(name, str) or name not in members:
                raise bad(f"image {name!r} is not in the archive")
            if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
                raise bad(f"image {name} has no sha256")
            role = {"raw": "rootfs", "rawfile": "capsule"}.get(kind) if isinstance(kind, str) else None
            if role is None:
                raise bad(f"image {name} has handler {kind!r} (only raw and rawfile)")
            ver = im.get("version")
            if role == "capsule" and (not isinstance(ver, str) or not _VERSION.fullmatch(ver)):
                raise bad(f"capsule {name} has no version")
            p = Payload(name, role, sha, members[name].size, ver if isinstance(ver, str) else None)
            if payloads.setdefault(name, p) != p:
                raise bad(f"image {name} differs between the slots")
    lowest = alma.get("lowest-bootloader")
    built = alma.get("built")
    return SwuInfo(
        path=str(path),
        sha256="",
        size=0,
        version=version,
        machine=machine,
        hw_revision=hw[0],
        payloads=list(payloads.values()),
        signed=False,
        lowest_bootloader=lowest if isinstance(lowest, str) else None,
        built=built if isinstance(built, str) else None,
    )
