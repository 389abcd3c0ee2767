"""Test-only ``.swu`` makers, the way meta-swupdate's class makes them.

classes-recipe/swupdate-common.bbclass (scarthgap) signs ``sw-description`` with
``openssl cms -sign ... -outform DER -nosmimecap -binary`` and then runs, in its work dir,
``for i in sw-description sw-description.sig <images>; do echo $i; done | cpio -ov -H crc
--reproducible > IMAGE.swu``. :func:`pack` runs that same cpio command (Debian's GNU cpio) on
files in that order; nothing here writes cpio itself. The product never writes a ``.swu``
(the image build does), so none of this lives in src/.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from almaboard.swu import CAPSULE_STAGING, DESCRIPTION, SELECTION, SIGNATURE, SLOTS, Payload, slot_target

CAPSULE_NAME = "tegra-bl.cap"


def require_cpio() -> str:
    import os

    exe = shutil.which("cpio")
    if exe is None:
        import pytest

        if os.environ.get("CI") == "true":
            pytest.fail("cpio missing in CI (apt-get install cpio)")
        pytest.skip("GNU cpio not installed (Debian: apt-get install cpio)")
    return exe


def pack(out: Path, members: list[tuple[str, bytes | Path]], *, fmt: str = "crc") -> Path:
    """``cpio -ov -H <fmt> --reproducible`` over ``members`` (name, bytes or file) in this order."""
    cpio = require_cpio()
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".swu-") as d:
        for name, data in members:
            if isinstance(data, Path):
                shutil.copyfile(data, Path(d) / name)
            else:
                (Path(d) / name).write_bytes(data)
        names = "".join(f"{n}\n" for n, _ in members).encode()
        with out.open("wb") as f:
            subprocess.run([cpio, "-ov", "-H", fmt, "--reproducible"], input=names, stdout=f,
                           stderr=subprocess.DEVNULL, cwd=d, check=True, timeout=600)  # fmt: skip
    return out


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sign_detached(data: bytes, cert_pem: bytes, key_pem: bytes) -> bytes:
    """A detached CMS (PKCS#7 SignedData) signature in DER, what ``openssl cms -sign -binary
    -nosmimecap -outform DER`` writes (the bbclass's CMS signing) and SWUpdate reads."""
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
    built: str = "2026-12-01T00:00:00Z",
) -> bytes:
    """The JSON ``sw-description`` layers/meta-alma's template renders to. ``root`` prefixes
    every target path ("/" on a board; "" makes them relative, for a simulated board's dir)."""
    sets: dict[str, Any] = {}
    for slot in SLOTS:
        images: list[dict[str, Any]] = []
        for p in payloads:
            if p.kind == "rootfs":
                images.append({"filename": p.filename, "type": "raw", "sha256": p.sha256,
                               "device": root + slot_target("raw", slot)})  # fmt: skip
            else:
                images.append({"filename": p.filename, "type": "rawfile", "sha256": p.sha256,
                               "path": root + CAPSULE_STAGING, "version": p.version})  # fmt: skip
        sets[f"slot-{slot}"] = {"images": images}
    alma: dict[str, Any] = {"machine": machine, "built": built}
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
    fmt: str = "crc",
) -> Path:
    """A signed ``.swu`` as meta-swupdate's class writes it (crc cpio, description, signature, images)."""
    payloads = [Payload("rootfs.ext4", "rootfs", sha256_file(rootfs), rootfs.stat().st_size)]
    files: list[tuple[str, bytes | Path]] = [("rootfs.ext4", rootfs)]
    if capsule is not None:
        assert capsule_version is not None
        payloads.append(Payload(CAPSULE_NAME, "capsule", sha256_file(capsule), capsule.stat().st_size, capsule_version))
        files.append((CAPSULE_NAME, capsule))
    desc = description(machine=machine, version=version, payloads=payloads, hw_revision=hw_revision, root=root,
                       lowest_bootloader=lowest_bootloader)  # fmt: skip
    sig = sign_detached(desc, cert_pem, key_pem)
    return pack(out, [(DESCRIPTION, desc), (SIGNATURE, sig), *files], fmt=fmt)
