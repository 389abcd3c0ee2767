"""Supply-chain facts in `alma verify` from the image's own SPDX and cve-check files (issue 22),
in the shapes the pinned oe-core writes (tests/artefacts/sbomfix.py has the provenance), plus
hostile files: each a clear exit 2 naming the file, never 70, nothing written."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from artefacts import sbomfix as sf
from artefacts.alma_deployfix import build_deploy
from gates.test_gates import write_doc

from alma.artefacts import sbom
from alma.artefacts.manifest import load_manifest, manifest_path
from alma.ground import utc_iso

MACHINE = "jetson-orin-nano-devkit"
LINK = f"alma-image-{MACHINE}.rootfs"


def _facts(project: Path) -> dict:
    m = load_manifest(manifest_path(project, "alma-image", MACHINE))
    return {k: f.value for k, f in m.facts.items()}


def test_cve_check_and_spdx3_become_facts(project: Path, alma) -> None:
    d = build_deploy(project)
    sf.write_cve(d.dir, LINK)
    sf.write_spdx3(d.dir, LINK)
    sf.write_nvd_db(project / "build" / "downloads", 1_795_000_000)
    r = alma("verify", d.dir, "--root", project)
    assert r.code == 0, r.err
    f = _facts(project)
    assert f["sbom_format"] == "SPDX-3.0.1" and f["sbom_package_count"] == 5
    assert f["licences"]["LicenseRef-Proprietary"] == 1 and f["licence_proprietary"] == ["tegra-binaries"]
    assert f["licence_unknown"] == ["mystery"]
    assert f["cve_package_count"] == 4
    counts = f["cve_counts"]
    # 9.8 critical, 7.0 high (the boundary), 9.1 critical, 5.0 medium; busybox: v4 8.9 beats v3 6.9 -> high
    assert counts["Patched"]["critical"] == 1 and counts["Unpatched"]["high"] == 2
    assert counts["Ignored"]["critical"] == 1 and counts["Ignored"]["medium"] == 1
    assert f["cve_unpatched_critical"] == 0 and f["cve_unpatched_high"] == 2
    assert f["cve_unpatched"] == ["busybox CVE-2023-0005 high", "openssl CVE-2024-0002 high"]
    assert {"package": "openssl", "id": "CVE-2024-0003", "detail": "not-applicable-config"} in f["cve_ignored"]
    assert f["cve_ignored_without_detail"] == ["openssl CVE-2024-0004"]
    assert f["cve_blind_spots"] == ["alma-guard", "tegra-binaries"]
    assert f["cve_blind_spots_critical"] == ["tegra-binaries"]  # Proprietary in the SBOM, and the boot chain
    assert f["nvd_data_date"] == utc_iso(1_795_000_000)


def test_without_the_image_report_the_build_summary_is_read(project: Path, alma) -> None:
    d = build_deploy(project)
    summary = d.dir.parent.parent.parent / "log" / "cve" / "cve-summary.json"
    summary.parent.mkdir(parents=True)
    summary.write_text(json.dumps(sf.default_cve(), indent=2))
    assert alma("verify", d.dir, "--root", project).code == 0
    m = load_manifest(manifest_path(project, "alma-image", MACHINE))
    assert m.value("cve_unpatched_high") == 2 and "cve-summary.json" in m.fact("cve_counts").source


def test_spdx22_tarball_is_read_through_its_index(project: Path, alma) -> None:
    d = build_deploy(project)
    sf.write_spdx22(d.dir, LINK)
    r = alma("verify", d.dir, "--root", project)
    assert r.code == 0, r.err
    f = _facts(project)
    assert f["sbom_format"] == "SPDX-2.2" and f["sbom_package_count"] == 5
    assert f["licence_proprietary"] == ["tegra-binaries"]
    assert f["cve_counts"] is None and f["nvd_data_date"] is None  # security feature off: unknown, not zero


def test_no_supply_chain_files_are_null_facts_with_a_reason(project: Path, alma) -> None:
    d = build_deploy(project)
    assert alma("verify", d.dir, "--root", project).code == 0
    m = load_manifest(manifest_path(project, "alma-image", MACHINE))
    assert m.value("cve_unpatched_critical") is None and "security feature is off" in m.fact("cve_counts").source
    assert m.value("sbom_package_count") is None


def test_verify_sbom_prints_the_summary_and_json_has_all(project: Path, alma) -> None:
    d = build_deploy(project)
    sf.write_cve(d.dir, LINK)
    sf.write_spdx3(d.dir, LINK)
    r = alma("verify", d.dir, "--root", project, "--sbom")
    assert r.code == 0, r.err
    assert "SBOM: SPDX-3.0.1, 5 packages" in r.out and "Proprietary: 1 tegra-binaries" in r.out
    assert "Unpatched" in r.out and "without a detail (a finding): 1 openssl CVE-2024-0004" in r.out
    assert "Proprietary or boot chain: tegra-binaries" in r.out
    r = alma("verify", d.dir, "--root", project, "--json")
    facts = json.loads(r.out)["facts"]
    assert facts["cve_ignored"]["value"] and facts["licences"]["value"]["MIT"] == 1


def test_a_gate_claim_of_no_unpatched_critical_goes_stale_when_one_appears(project: Path, alma) -> None:
    d = build_deploy(project)
    sf.write_cve(d.dir, LINK)
    assert alma("verify", d.dir, "--root", project).code == 0
    write_doc(
        project,
        "No unpatched critical CVE: <!-- fact:cve_unpatched_critical -->0<!-- /fact -->.\n",
        claims="cve_unpatched_critical: 0",
    )
    r = alma("gates", "check", "--root", project)
    assert r.code == 0, (r.out, r.err)
    data = sf.default_cve()
    data["package"][1]["issue"].append(sf.issue("CVE-2026-9999", "Unpatched", v3="9.0"))
    sf.write_cve(d.dir, LINK, data)
    assert alma("verify", d.dir, "--root", project).code == 0
    r = alma("gates", "check", "--root", project)
    assert r.code == 1 and "cve_unpatched_critical" in r.out, (r.out, r.err)


def _deep(n: int) -> bytes:
    return b'{"version": "1", "package": ' + b"[" * n + b"]" * n + b"}"


HOSTILE_CVE = {
    "not UTF-8": (b'{"version": "1", "package": [{"name": "caf\xe9"}]}', "not UTF-8"),
    "deep": (_deep(100_000), "nested too deeply"),
    "package not a list": (b'{"version": "1", "package": {"a": 1}}', 'no "package" list'),
    "wrong version": (b'{"version": "2", "package": []}', "version '2'"),
    "duplicate package": (
        json.dumps({"version": "1", "package": [sf.package("a", "1", []), sf.package("a", "1", [])]}).encode(),
        "package 'a' appears twice",
    ),
    "duplicate CVE": (
        json.dumps({"version": "1", "package": [sf.package("a", "1", [sf.issue("CVE-2024-1", "Unpatched")] * 2)]})
        .replace("CVE-2024-1", "CVE-2024-1111")
        .encode(),
        "CVE-2024-1111 listed twice",
    ),
    "bad status": (
        json.dumps({"version": "1", "package": [sf.package("a", "1", [sf.issue("CVE-2024-1111", "Fixed")])]}).encode(),
        "status 'Fixed'",
    ),
    "score not a number": (
        json.dumps(
            {"version": "1", "package": [sf.package("a", "1", [sf.issue("CVE-2024-1111", "Patched", "x")])]}
        ).encode(),
        "score 'x' is not a number",
    ),
    "score as a list": (
        json.dumps(
            {
                "version": "1",
                "package": [
                    {
                        **sf.package("a", "1", []),
                        "issue": [{"id": "CVE-2024-1111", "status": "Patched", "scorev3": [9]}],
                    }
                ],
            }
        ).encode(),  # fmt: skip
        "score [9]",
    ),
    "NaN": (b'{"version": "1", "package": [], "x": NaN}', "NaN is not a JSON number"),
}


@pytest.mark.parametrize("case", HOSTILE_CVE)
def test_hostile_cve_json_is_exit_2_naming_the_file(project: Path, alma, case: str) -> None:
    raw, needle = HOSTILE_CVE[case]
    d = build_deploy(project)
    sf.write_cve(d.dir, LINK, raw=raw)
    r = alma("verify", d.dir, "--root", project)
    assert r.code == 2, (r.out, r.err)
    assert f"{LINK}.json: " in r.err and needle in r.err, r.err
    assert "internal error" not in r.err and not manifest_path(project, "alma-image", MACHINE).exists()


def test_a_huge_document_is_refused_before_it_is_read(project: Path, alma, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sbom, "MAX_JSON_BYTES", 1000)
    d = build_deploy(project)
    sf.write_spdx3(d.dir, LINK)
    r = alma("verify", d.dir, "--root", project)
    assert r.code == 2 and "over the 0 MiB a document may have" in r.err, r.err


HOSTILE_SPDX3 = {
    "duplicate spdxId": (
        json.dumps(
            {"@context": sf.SPDX3_CONTEXT, "@graph": [{"type": "software_Package", "spdxId": "x", "name": "a"}] * 2}
        ),
        "spdxId x appears twice",
    ),
    "no graph": (json.dumps({"@context": sf.SPDX3_CONTEXT}), 'no "@graph" list'),
    "SPDX 2 posing as 3": (json.dumps({"@context": "https://example.org/x", "@graph": []}), "is not SPDX 3.0"),
    "package without a name": (
        json.dumps({"@context": sf.SPDX3_CONTEXT, "@graph": [{"type": "software_Package", "spdxId": "x", "name": 7}]}),
        "package without name/spdxId",
    ),
    "to is not a list": (
        json.dumps(
            {
                "@context": sf.SPDX3_CONTEXT,
                "@graph": [{"type": "Relationship", "from": "a", "relationshipType": "hasDeclaredLicense", "to": "b"}],
            }
        ),  # fmt: skip
        "'to' 'b'",
    ),
}


@pytest.mark.parametrize("case", HOSTILE_SPDX3)
def test_hostile_spdx3_is_exit_2(project: Path, alma, case: str) -> None:
    text, needle = HOSTILE_SPDX3[case]
    d = build_deploy(project)
    sf.write_spdx3(d.dir, LINK, raw=text.encode())
    r = alma("verify", d.dir, "--root", project)
    assert r.code == 2 and needle in r.err and "internal error" not in r.err, r.err


def _link_member() -> tarfile.TarInfo:
    info = tarfile.TarInfo("evil.spdx.json")
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    return info


HOSTILE_SPDX22 = {
    "not zstd": (b"this is not zstd at all", "not a zstd stream"),
    "symlink member": ("tar", [_link_member()], "is not a regular file"),
    "no index": ("notar", None, "no index.json"),
}


@pytest.mark.parametrize("case", HOSTILE_SPDX22)
def test_hostile_spdx22_tarball_is_exit_2_and_nothing_is_extracted(project: Path, alma, case: str) -> None:
    import zstandard

    d = build_deploy(project)
    spec = HOSTILE_SPDX22[case]
    if spec[0] == "tar":
        sf.write_spdx22(d.dir, LINK, tar_bytes=sf.spdx22_tar(sf.LICENCES, extra=spec[1]))
    elif spec[0] == "notar":
        sf.write_spdx22(d.dir, LINK, raw=zstandard.ZstdCompressor().compress(b"\0" * 1024))
    else:
        sf.write_spdx22(d.dir, LINK, raw=spec[0])
    before = sorted(p.name for p in d.dir.iterdir())
    r = alma("verify", d.dir, "--root", project)
    assert r.code == 2 and spec[-1] in r.err and "internal error" not in r.err, r.err
    assert sorted(p.name for p in d.dir.iterdir()) == before
