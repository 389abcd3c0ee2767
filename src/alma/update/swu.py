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
import os
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
    signers: list[dict[str, str]] = field(default_factory=list)  # the VERIFIED signer: subject, sha256
    verified: bool | None = None  # None: no fleet certificate to check against here
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


def verify_signature(description: bytes, signature: bytes, cert: Path) -> dict[str, str] | None:
    """The signer when ``signature`` is a CMS signature over ``description`` by ``cert`` (or a
    certificate it issued), as SWUpdate judges it (``swupdate -k``: the certificate is the trust
    store, certificates carried in the bag are not trusted by being there); else None.

    ``openssl cms -verify`` through the one runner: a certs-only bag has no signer and fails,
    an attacker's signature with the fleet certificate added does not chain to it and fails."""
    import tempfile

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    from alma import runner
    from alma.errors import ToolError, ToolNotFound
    from alma.settings import tool

    with tempfile.TemporaryDirectory(prefix="alma-cms-") as d:
        sig, desc, signer = Path(d) / "sig.der", Path(d) / "sw-description", Path(d) / "signer.pem"
        sig.write_bytes(signature)
        desc.write_bytes(description)
        argv = [tool("openssl"), "cms", "-verify", "-binary", "-inform", "DER", "-in", str(sig),
                "-content", str(desc), "-CAfile", str(cert), "-purpose", "any", "-signer", str(signer),
                "-out", os.devnull]  # fmt: skip
        try:
            r = runner.run(argv, check=False, timeout=60, what="openssl cms -verify", max_output=1 << 16)
        except (ToolError, ToolNotFound) as exc:
            raise SwuError(f"cannot check the signature: {exc.message}", hint="install openssl") from None
        if r.returncode != 0 or not signer.is_file():
            return None
        certs = x509.load_pem_x509_certificates(signer.read_bytes())
    if len(certs) != 1:
        return None  # one signer, as meta-swupdate's class signs
    c = certs[0]
    return {"subject": c.subject.rfc4514_string(), "sha256": c.fingerprint(hashes.SHA256()).hex()}


def read_swu(path: Path, *, hashes: bool = True, cert: Path | None = None) -> SwuInfo:
    """What the ``.swu`` claims (and, with ``hashes``, whether its payloads and cpio checksums
    match; with ``cert``, the fleet certificate, whether its signature is that signer's)."""
    try:
        swu = board_swu.read(path)
        digest = board_swu.check_payloads(swu) if hashes else sha256_file(path)
    except SwuRefused as exc:
        raise SwuError(exc.message, hint=exc.hint) from None
    except OSError as exc:
        raise SwuError(f"cannot read {path}: {exc.strerror}", hint="check the path") from None
    signer = None
    if cert is not None and swu.signature is not None:
        signer = verify_signature(swu.description, swu.signature, cert)
    return SwuInfo(
        path=str(path),
        sha256=digest,
        size=path.stat().st_size,
        version=swu.version,
        machine=swu.machine,
        hw_revision=swu.hw_revision,
        payloads=swu.payloads,
        signed=swu.signature is not None,
        signers=[signer] if signer else [],
        verified=None if cert is None else signer is not None,
        lowest_bootloader=swu.lowest_bootloader,
        built=swu.built,
        hashes_checked=hashes,
        format=swu.format,
    )
