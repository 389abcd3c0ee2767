"""classes/alma-ota.bbclass (feature ota): its parse-time refusals, run as bitbake runs them
(the anonymous python body with a datastore), and oelint-adv clean on the ota recipes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from layer.test_access_layer import BB, D, Fatal, python_body

from alma.update.swu import PARTLABEL

LAYER = Path(__file__).resolve().parents[2] / "layers" / "meta-alma"
CLASS = LAYER / "classes" / "alma-ota.bbclass"
SWDESC = LAYER / "dynamic-layers/swupdate/recipes-core/images/files/sw-description"

GOOD = {"ALMA_OTA": "1", "MACHINE": "jetson-agx-orin-devkit", "HAS_REDUNDANT_PARTITION_LAYOUT_EXTERNAL": "1",
        "USE_REDUNDANT_FLASH_LAYOUT": "1", "ALMA_RELEASE": "1", "ALMA_OTA_CERT": "/k/ota-cert.pem",
        "UEFI_CAPSULE_SIGNER_PRIVATE_CERT": "/keys/capsule-signer.pem"}  # fmt: skip


def run(**over: str) -> BB:
    bb = BB()
    exec(compile(python_body(CLASS, "__anonymous"), str(CLASS), "exec"), {"d": D({**GOOD, **over}), "bb": bb})
    return bb


def image_install_append(**over: str) -> str:
    """The class's ``IMAGE_INSTALL:append`` as bitbake expands it (its inline python)."""
    m = re.search(r"^IMAGE_INSTALL:append = \"(.*)\"$", CLASS.read_text(), re.MULTILINE)
    assert m, "alma-ota.bbclass appends nothing to IMAGE_INSTALL"
    d = D({**GOOD, **over})
    # bitbake evaluates ${@...} as python with the datastore as d
    return re.sub(r"\$\{@(.*?)\}", lambda e: str(eval(e.group(1), {"d": d})), m.group(1))


def test_a_release_with_ab_layout_cert_and_own_capsule_keys_passes_and_installs_the_agent() -> None:
    assert run().notes == []
    assert image_install_append().split() == ["alma-ota"]


def test_machine_without_redundant_layout_is_refused_by_name() -> None:
    with pytest.raises(Fatal, match="MACHINE p3768-0000-p3767-0001 has none"):
        run(
            MACHINE="p3768-0000-p3767-0001", HAS_REDUNDANT_PARTITION_LAYOUT_EXTERNAL="0", USE_REDUNDANT_FLASH_LAYOUT="0"
        )


@pytest.mark.parametrize("signer", ["", "/x/BaseTools/Source/Python/Pkcs7Sign/TestCert.pem"])
def test_release_capsule_signed_with_edk2_test_certs_fails_unless_a_lab_build(signer: str) -> None:
    with pytest.raises(Fatal, match="EDK2 TEST certificates"):
        run(UEFI_CAPSULE_SIGNER_PRIVATE_CERT=signer)
    run(UEFI_CAPSULE_SIGNER_PRIVATE_CERT=signer, ALMA_OTA_ALLOW_TEST_CAPSULE_CERTS="1")
    run(UEFI_CAPSULE_SIGNER_PRIVATE_CERT=signer, ALMA_RELEASE="0")  # a development build


def test_release_without_the_ota_cert_fails() -> None:
    with pytest.raises(Fatal, match="needs ALMA_OTA_CERT"):
        run(ALMA_OTA_CERT="")


def test_without_the_feature_the_class_does_nothing() -> None:
    assert run(ALMA_OTA="0", HAS_REDUNDANT_PARTITION_LAYOUT_EXTERNAL="0", ALMA_OTA_CERT="").notes == []
    assert image_install_append(ALMA_OTA="0").split() == []


def test_the_sw_description_template_is_what_alma_ota_and_the_reader_expect() -> None:
    """After meta-swupdate's substitutions, the layout src/alma/update/swu.py reads."""
    text = SWDESC.read_text().replace("@@MACHINE@@", "jetson-agx-orin-devkit").replace("@@ALMA_OTA_VERSION@@", "0.1")
    text = text.replace("@@ALMA_OTA_LOWEST_BOOTLOADER@@", "36.5.0").replace("@@L4T_VERSION@@", "36.5.0")
    assert "@@" not in text
    doc = json.loads(text.replace("$swupdate_get_sha256", "sha"))
    sets = doc["software"]["jetson-agx-orin-devkit"]["alma"]
    for slot in ("a", "b"):
        rootfs, cap = sets[f"slot-{slot}"]["images"]
        assert rootfs["type"] == "raw" and rootfs["device"] == f"/dev/disk/by-partlabel/{PARTLABEL[slot]}"
        assert cap["type"] == "rawfile" and cap["path"] == "/var/lib/alma-ota/capsule/TEGRA_BL.Cap"
