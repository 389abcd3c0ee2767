"""`alma verify --vex`: the image's cve-check findings as a CycloneDX 1.6 VEX document, checked
against the CycloneDX JSON schema by cyclonedx-python-lib's strict validator (the schema the
reviewer's tools load)."""

from __future__ import annotations

import json
from pathlib import Path

from artefacts import sbomfix as sf
from artefacts.alma_deployfix import build_deploy
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from alma.artefacts.manifest import manifest_path

MACHINE = "jetson-orin-nano-devkit"
LINK = f"alma-image-{MACHINE}.rootfs"


def test_the_fixture_builds_vex_is_valid_cyclonedx_with_grades_and_reasons(project: Path, alma, tmp_path) -> None:
    d = build_deploy(project)
    data = sf.default_cve()
    data["package"][1]["issue"].append(sf.issue("CVE-2014-0160", "Unpatched", v2="10.0"))
    sf.write_cve(d.dir, LINK, data)
    out = tmp_path / "alma-image.vex.json"
    r = alma("verify", d.dir, "--root", project, "--vex", out)
    assert r.code == 0, r.err
    text = out.read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    doc = json.loads(text)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.6"
    assert doc["metadata"]["component"]["name"] == "alma-image"
    vulns = {(v["id"], v["affects"][0]["ref"]): v for v in doc["vulnerabilities"]}
    heartbleed = vulns[("CVE-2014-0160", "pkg:busybox")]
    assert heartbleed["analysis"]["state"] == "exploitable"
    assert heartbleed["ratings"] == [{"method": "CVSSv2", "score": 10.0, "severity": "high", "source": {"name": "NVD"}}]
    waived = vulns[("CVE-2024-0003", "pkg:openssl")]["analysis"]
    assert waived == {
        "state": "not_affected",
        "detail": "cve-check: Ignored (not-applicable-config): built without the affected engine",
    }
    assert vulns[("CVE-2024-0001", "pkg:openssl")]["analysis"]["state"] == "resolved"
    assert {c["name"] for c in doc["components"]} >= {"openssl", "busybox", "tegra-binaries"}


def test_no_cve_report_no_vex_and_nothing_written(project: Path, alma, tmp_path) -> None:
    d = build_deploy(project)
    out = tmp_path / "vex.json"
    r = alma("verify", d.dir, "--root", project, "--vex", out)
    assert r.code == 2 and "no cve-check report" in r.err and "--feature security" in r.err
    assert not out.exists() and not manifest_path(project, "alma-image", MACHINE).exists()
