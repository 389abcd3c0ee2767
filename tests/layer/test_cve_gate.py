"""The release image's CVE gate (classes/alma-release-check.bbclass alma_cve_gate),
run on cve-check reports in the shape oe-core writes (tests/artefacts/sbomfix.py): an
Unpatched CVE with CVSS v3/v4 >= 9.0 fails a release; a waiver (CVE_STATUS -> Ignored with a
detail), a development build or the gate off lets it through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from artefacts import sbomfix as sf
from layer.test_access_layer import BB, CHECK, D, Fatal, python_body


def run_gate(report: Path | None, **over: str) -> BB:
    values = {"ALMA_RELEASE": "1", "ALMA_CVE_GATE": "1", "CVE_CHECK_MANIFEST_JSON": str(report), **over}
    bb = BB()
    exec(compile(python_body(CHECK, "alma_cve_gate"), str(CHECK), "exec"), {"d": D(values), "bb": bb})
    return bb


def _report(tmp_path: Path, issues: list[dict]) -> Path:
    p = tmp_path / "alma-image.json"
    p.write_text(json.dumps({"version": "1", "package": [sf.package("openssl", "3.2.4", issues)]}))
    return p


@pytest.mark.parametrize(
    ("v2", "v3", "v4"), [("0.0", "9.8", "0.0"), ("0.0", "0.0", "9.0"), ("0.0", "8.9", "9.3"), ("10.0", "0.0", "0.0")]
)
def test_an_unpatched_critical_fails_a_release(tmp_path: Path, v2: str, v3: str, v4: str) -> None:
    # the last case: an older NVD entry scored by CVSS v2 only (high 7.0-10.0, no critical band)
    report = _report(tmp_path, [sf.issue("CVE-2024-0002", "Unpatched", v3=v3, v4=v4, v2=v2)])
    with pytest.raises(Fatal, match=r"unpatched critical CVE \(CVSS >= 9.0\): openssl CVE-2024-0002"):
        run_gate(report)


def test_high_waived_or_patched_pass_and_say_so(tmp_path: Path) -> None:
    report = _report(
        tmp_path,
        [
            sf.issue("CVE-2024-0001", "Unpatched", v3="8.9"),
            sf.issue("CVE-2014-0001", "Unpatched", v2="10.0", v3="6.0"),  # v3 present: v2 not looked at
            sf.issue("CVE-2024-0003", "Ignored", v3="9.8", detail="not-applicable-config"),
            sf.issue("CVE-2024-0004", "Patched", v3="10.0", detail="fixed-version"),
        ],
    )
    assert any("no unpatched critical CVE" in n for n in run_gate(report).notes)


def test_the_gate_is_off_for_development_builds_and_without_the_feature(tmp_path: Path) -> None:
    report = _report(tmp_path, [sf.issue("CVE-2024-0002", "Unpatched", v3="9.8")])
    assert run_gate(report, ALMA_RELEASE="0").notes == []
    assert run_gate(report, ALMA_CVE_GATE="0").notes == []
    with pytest.raises(Fatal, match="no cve-check report"):
        run_gate(tmp_path / "missing.json")
