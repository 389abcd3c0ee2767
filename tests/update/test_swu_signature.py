"""The desktop judges the CMS signature over sw-description against the fleet certificate,
as SWUpdate does (``swupdate -k``), never by the certificates carried in the signature: a
certs-only PKCS#7 bag, or an attacker's signature with the fleet certificate added, is not
"signed by" the fleet. The same files are run through the real SWUpdate as the reference."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from almaboard.swu import DESCRIPTION, SIGNATURE, Payload
from artefacts.alma_deployfix import alma, build_deploy, project  # noqa: F401 - fixtures
from support import require_tool
from support_swu import description, pack, sign_detached
from support_update import MACHINE, make_cert, require_swupdate, rootfs_image, swupdate_argv

from alma.update.swu import read_swu


def _desc(tmp: Path) -> tuple[bytes, Path]:
    img = rootfs_image(tmp / "r.ext4", "2.0.0")
    p = Payload("rootfs.ext4", "rootfs", hashlib.sha256(img.read_bytes()).hexdigest(), img.stat().st_size)
    return description(machine=MACHINE, version="2.0.0", payloads=[p], root=""), img


def _forged(tmp: Path, fleet: tuple[bytes, bytes], kind: str) -> Path:
    openssl = require_tool("openssl")
    (tmp / "fleet.pem").write_bytes(fleet[0])
    desc, img = _desc(tmp)
    if kind == "certs-only bag":  # a PKCS#7 holding the fleet certificate and no signer
        argv = [openssl, "crl2pkcs7", "-nocrl", "-certfile", str(tmp / "fleet.pem"), "-outform", "DER"]
    else:  # an attacker's own key signs this very description; the fleet certificate rides along
        atk, atk_key = make_cert(tmp / "attacker", cn="ALMA-OS fleet OTA")
        (tmp / "atk.pem").write_bytes(atk)
        (tmp / "atk.key").write_bytes(atk_key)
        (tmp / "desc").write_bytes(desc)
        argv = [openssl, "cms", "-sign", "-binary", "-nosmimecap", "-outform", "DER", "-in", str(tmp / "desc"),
                "-signer", str(tmp / "atk.pem"), "-inkey", str(tmp / "atk.key"),
                "-certfile", str(tmp / "fleet.pem")]  # fmt: skip
    sig = subprocess.run(argv, capture_output=True, check=True, timeout=60).stdout
    return pack(tmp / "forged.swu", [(DESCRIPTION, desc), (SIGNATURE, sig), ("rootfs.ext4", img)])


FORGED = ["certs-only bag", "attacker's signature with the fleet certificate added"]


def _real_swupdate(tmp: Path, swu: Path, cert: bytes) -> str:
    require_swupdate()
    board = tmp / "board"
    (board / "dev/disk/by-partlabel").mkdir(parents=True, exist_ok=True)
    (board / "dev/disk/by-partlabel/APP_b").write_bytes(b"\0" * 200_000)
    (tmp / "k.pem").write_bytes(cert)
    (tmp / "swtmp").mkdir(exist_ok=True)
    r = subprocess.run([*swupdate_argv("-k", str(tmp / "k.pem"), "-H", f"{MACHINE}:1.0", "-e", "alma,slot-b", "-i",
                        str(swu))], cwd=board, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "TMPDIR": str(tmp / "swtmp")})  # fmt: skip
    return r.stdout + r.stderr


@pytest.mark.parametrize("kind", FORGED)
def test_a_forged_signature_is_not_signed_by_the_fleet_on_the_desktop_nor_on_swupdate(
    tmp_path: Path, signer: tuple[bytes, bytes], kind: str
) -> None:
    swu = _forged(tmp_path, signer, kind)
    info = read_swu(swu, cert=tmp_path / "fleet.pem")
    assert info.signed and info.verified is False and info.signers == []
    if kind != "certs-only bag":  # a sound signature, only not the fleet's
        assert read_swu(swu, cert=tmp_path / "atk.pem").verified is True
    log = _real_swupdate(tmp_path, swu, signer[0])
    assert "SWUPDATE successful" not in log, log


def test_the_fleets_own_signature_is_verified_and_names_its_signer(tmp_path: Path, signer: tuple[bytes, bytes]) -> None:
    (tmp_path / "fleet.pem").write_bytes(signer[0])
    desc, img = _desc(tmp_path)
    sig = sign_detached(desc, *signer)
    swu = pack(tmp_path / "ok.swu", [(DESCRIPTION, desc), (SIGNATURE, sig), ("rootfs.ext4", img)])
    info = read_swu(swu, cert=tmp_path / "fleet.pem")
    assert info.verified is True and [s["subject"] for s in info.signers] == ["CN=ALMA-OS OTA test"]
    other, _ = make_cert(tmp_path / "other", cn="another fleet")
    (tmp_path / "other.pem").write_bytes(other)
    assert read_swu(swu, cert=tmp_path / "other.pem").verified is False
    assert "SWUPDATE successful" in _real_swupdate(tmp_path, swu, signer[0])


@pytest.mark.parametrize("kind", FORGED)
def test_verify_records_a_forged_signature_as_not_signed_and_fails(project: Path, alma,  # type: ignore[no-untyped-def]  # noqa: F811
                                                                   signer: tuple[bytes, bytes], tmp_path: Path,
                                                                   kind: str) -> None:  # fmt: skip
    swu = _forged(tmp_path, signer, kind)
    (project / "fleet.pem").write_bytes(signer[0])
    (project / "alma.toml").write_text('[ota]\nsigning_cert = "fleet.pem"\n')
    d = build_deploy(project, MACHINE)
    (d.dir / f"alma-image-swu-{MACHINE}.swu").write_bytes(swu.read_bytes())
    r = alma("verify", d.dir, "--root", project)
    assert r.code != 0 and "not a signature by the fleet certificate" in r.err + r.out, r.err + r.out


@pytest.mark.parametrize("kind", FORGED)
def test_update_refuses_a_forged_signature_before_any_board(tmp_path: Path, signer: tuple[bytes, bytes],
                                                            kind: str) -> None:  # fmt: skip
    import sys

    swu = _forged(tmp_path, signer, kind)
    (tmp_path / "fleet.toml").write_text('[[node]]\nname = "b1"\nssh = "b1"\nrole = "board"\n')
    r = subprocess.run([sys.executable, "-m", "alma", "update", str(swu), "--fleet", str(tmp_path / "fleet.toml"),
                        "--cert", str(tmp_path / "fleet.pem"), "--dry-run"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "HOME": str(tmp_path)})  # fmt: skip
    assert r.returncode == 2 and "not signed by the fleet certificate" in r.stderr, r.stdout + r.stderr
    assert "signed by CN=" not in r.stdout
