"""A VEX document of an image: cve-check's findings as CycloneDX 1.6 vulnerabilities, built and
serialized by cyclonedx-python-lib (the CycloneDX project's own library), so a reviewer's
tools (Dependency-Track, cyclonedx-cli, grype/trivy with VEX) load it.

Mapping (cve-check status -> CycloneDX ``analysis.state``): Patched -> ``resolved``,
Ignored (a CVE_STATUS waiver) -> ``not_affected`` with the status key and the waiver's reason
in ``analysis.detail``, Unpatched -> ``exploitable`` (the version is in NVD's affected range
and no patch is applied: affected, in VEX terms). Each rating carries the CVSS version the
issue is graded by (docs/verify.md, "CVE severity") and its score. Components are the
packages cve-check looked at (bom-ref ``pkg:<name>``).
"""

from __future__ import annotations

from decimal import Decimal

from alma.artefacts.sbom import CveReport, Issue

_STATE = {"Patched": "RESOLVED", "Ignored": "NOT_AFFECTED", "Unpatched": "EXPLOITABLE"}
_METHOD = {"4.0": "CVSS_V4", "3.x": "CVSS_V3_1", "2.0": "CVSS_V2"}


def vex_json(report: CveReport, image: str, machine: str) -> str:
    """The CycloneDX 1.6 JSON document (a BOM whose components are the checked packages)."""
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.model.impact_analysis import ImpactAnalysisState
    from cyclonedx.model.vulnerability import (
        BomTarget,
        Vulnerability,
        VulnerabilityAnalysis,
        VulnerabilityRating,
        VulnerabilityScoreSource,
        VulnerabilitySeverity,
        VulnerabilitySource,
    )
    from cyclonedx.output.json import JsonV1Dot6

    bom = Bom()
    root = Component(
        name=image, version=machine, type=ComponentType.OPERATING_SYSTEM, bom_ref=f"image:{image}:{machine}"
    )
    bom.metadata.component = root
    packages = [
        Component(name=name, type=ComponentType.LIBRARY, bom_ref=f"pkg:{name}")
        for name in sorted({i.package for i in report.issues} | set(report.blind_spots))
    ]
    for c in packages:
        bom.components.add(c)
    bom.register_dependency(root, packages)  # the image installs each of them
    nvd = VulnerabilitySource(name="NVD")

    def ratings(i: Issue) -> list[VulnerabilityRating]:
        if i.cvss is None:
            return []
        return [
            VulnerabilityRating(
                source=nvd,
                score=Decimal(f"{i.score:.1f}"),
                severity=VulnerabilitySeverity(i.severity),
                method=VulnerabilityScoreSource[_METHOD[i.cvss]],
            )
        ]

    for i in sorted(report.issues, key=lambda x: (x.package, x.cve)):
        detail = f"cve-check: {i.status}" + (f" ({i.detail})" if i.detail else "")
        detail += f": {i.reason}" if i.reason else ""
        bom.vulnerabilities.add(
            Vulnerability(
                bom_ref=f"{i.cve}:{i.package}",
                id=i.cve,
                source=nvd,
                ratings=ratings(i),
                affects=[BomTarget(ref=f"pkg:{i.package}")],
                analysis=VulnerabilityAnalysis(state=ImpactAnalysisState[_STATE[i.status]], detail=detail),
            )
        )
    return str(JsonV1Dot6(bom).output_as_string(indent=2))
