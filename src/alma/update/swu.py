"""The ``.swu`` update artefact as the desktop sees it (``alma update``, ``alma verify``).

The archive, its description and the allowlist are read by the board library's one reader
(``almaboard.swu``, shared with the board's OTA agent, so desktop and board cannot disagree
about a file); this module adds what only the desktop does: the payload hashes and cpio
checksums recomputed, and the CMS signature over ``sw-description`` read for its signers.

SWUpdate checks the signature against the certificate baked into the image (``swupdate -k``),
then streams each payload to its target and checks the sha256 the signed description names,
so a payload cannot be swapped without breaking the signature, and a description cannot be
changed without the key. ``-H <MACHINE>:<rev>`` on the board makes SWUpdate pick the
machine's section, ``-e alma,slot-b`` the inactive slot's set (docs/ota.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from almaboard import swu as board_swu
from almaboard.swu import (
    CAPSULE_STAGING,
    DESCRIPTION,
    PARTLABEL,
    SELECTION,
    SIGNATURE,
    SLOTS,
    TRAILER,
    Payload,
    SwuRefused,
    slot_target,
)

from alma.errors import UserError

__all__ = [
    "CAPSULE_STAGING", "DESCRIPTION", "PARTLABEL", "SELECTION", "SIGNATURE", "SLOTS", "TRAILER",
    "Payload", "SwuError", "SwuInfo", "read_swu", "sha256_file", "slot_target", "version_tuple",
]  # fmt: skip
CAPSULE_NAME = "tegra-bl.cap"
_CHUNK = 1 << 20


class SwuError(UserError):
    """The file is not a ``.swu`` we can read (exit 2, with what is wrong)."""


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
    format: str = "crc"  # the cpio format: crc (meta-swupdate) or newc

    @property
    def capsule(self) -> Payload | None:
        return next((p for p in self.payloads if p.kind == "capsule"), None)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["payloads"] = [asdict(p) for p in self.payloads]
        return d


def version_tuple(v: str) -> tuple[int, ...]:
    try:
        return board_swu.version_tuple(v)
    except SwuRefused as exc:
        raise SwuError(exc.message, hint=exc.hint) from None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while c := f.read(_CHUNK):
            h.update(c)
    return h.hexdigest()


def _signers(sig: bytes) -> list[dict[str, str]]:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.serialization import pkcs7

    try:
        certs = pkcs7.load_der_pkcs7_certificates(sig)
    except ValueError as exc:
        raise SwuError(f"sw-description.sig is not a CMS signature: {exc}") from None
    return [{"subject": c.subject.rfc4514_string(), "sha256": c.fingerprint(hashes.SHA256()).hex()} for c in certs]


def read_swu(path: Path, *, hashes: bool = True) -> SwuInfo:
    """What the ``.swu`` claims (and, with ``hashes``, whether its payloads and cpio checksums match)."""
    try:
        swu = board_swu.read(path)
        digest = board_swu.check_payloads(swu) if hashes else sha256_file(path)
    except SwuRefused as exc:
        raise SwuError(exc.message, hint=exc.hint) from None
    except OSError as exc:
        raise SwuError(f"cannot read {path}: {exc.strerror}", hint="check the path") from None
    return SwuInfo(
        path=str(path),
        sha256=digest,
        size=path.stat().st_size,
        version=swu.version,
        machine=swu.machine,
        hw_revision=swu.hw_revision,
        payloads=swu.payloads,
        signed=swu.signature is not None,
        signers=_signers(swu.signature) if swu.signature is not None else [],
        lowest_bootloader=swu.lowest_bootloader,
        built=swu.built,
        hashes_checked=hashes,
        format=swu.format,
    )
