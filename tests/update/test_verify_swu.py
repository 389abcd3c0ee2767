"""alma verify reads the image's .swu into facts (signed?, by whom, version, payload hashes)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from artefacts.alma_deployfix import alma, build_deploy, project  # noqa: F401 - fixtures
from support_swu import build_swu
from support_update import rootfs_image

from alma.artefacts.manifest import load_manifest, manifest_path

MACHINE = "jetson-agx-orin-devkit"


def test_verify_reads_the_swu_into_facts(project: Path, alma, signer: tuple[bytes, bytes], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    d = build_deploy(project, MACHINE)
    (project / "fleet.pem").write_bytes(signer[0])
    (project / "alma.toml").write_text('[ota]\nsigning_cert = "fleet.pem"\n')  # what the signature is checked against
    img = rootfs_image(tmp_path / "r.ext4", "1.4.0")
    cap = tmp_path / "tegra-bl.cap"
    cap.write_text("CAPSULE 36.4.4")
    swu = d.dir / f"alma-image-swu-{MACHINE}.swu"
    build_swu(swu, machine=MACHINE, version="1.4.0", rootfs=img, cert_pem=signer[0], key_pem=signer[1],
              capsule=cap, capsule_version="36.4.4")  # fmt: skip
    r = alma("verify", d.dir, "--root", project)
    assert r.code == 0, r.err
    f = {k: v.value for k, v in load_manifest(manifest_path(project, "alma-image", MACHINE)).facts.items()}
    assert f["swu_signed"] is True and f["swu_signers"] == ["CN=ALMA-OS OTA test"]
    assert f["swu_version"] == "1.4.0" and f["swu_capsule_version"] == "36.4.4"
    assert f["swu_payloads"] == {"rootfs.ext4": hashlib.sha256(img.read_bytes()).hexdigest(),
                                 "tegra-bl.cap": hashlib.sha256(cap.read_bytes()).hexdigest()}  # fmt: skip
    assert f["swu_sha256"] == hashlib.sha256(swu.read_bytes()).hexdigest()


def test_verify_fails_on_a_tampered_swu(project: Path, alma, signer: tuple[bytes, bytes], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    d = build_deploy(project, MACHINE)
    img = rootfs_image(tmp_path / "r.ext4", "1.4.0")
    swu = d.dir / f"alma-image-swu-{MACHINE}.swu"
    build_swu(swu, machine=MACHINE, version="1.4.0", rootfs=img, cert_pem=signer[0], key_pem=signer[1])
    data = bytearray(swu.read_bytes())
    data[data.index(img.read_bytes()[:64]) + 3000] ^= 1
    swu.write_bytes(bytes(data))
    r = alma("verify", d.dir, "--root", project)
    assert r.code != 0 and "does not match its signed sha256" in r.err + r.out


def test_verify_without_a_fleet_certificate_does_not_claim_signed(project: Path, alma, signer: tuple[bytes, bytes],  # type: ignore[no-untyped-def]  # noqa: F811
                                                                  tmp_path: Path) -> None:  # fmt: skip
    d = build_deploy(project, MACHINE)
    img = rootfs_image(tmp_path / "r.ext4", "1.4.0")
    build_swu(d.dir / f"alma-image-swu-{MACHINE}.swu", machine=MACHINE, version="1.4.0", rootfs=img,
              cert_pem=signer[0], key_pem=signer[1])  # fmt: skip
    assert alma("verify", d.dir, "--root", project).code == 0
    f = load_manifest(manifest_path(project, "alma-image", MACHINE)).facts
    assert f["swu_signed"].value is None and "not checked" in f["swu_signed"].source and f["swu_signers"].value == []
