"""Supply-chain facts in `alma verify` from the image's own SPDX and cve-check files,
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
from support import require_part

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
    assert f["cve_unpatched"] == [
        "busybox CVE-2023-0005 high (CVSS 4.0 8.9)",
        "openssl CVE-2024-0002 high (CVSS 3.x 7.0)",
    ]
    assert {
        "package": "openssl",
        "id": "CVE-2024-0003",
        "detail": "not-applicable-config",
        "reason": "built without the affected engine",
    } in f["cve_ignored"]
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
    assert "Unpatched" in r.out and "without a reason (a finding): 1 openssl CVE-2024-0004" in r.out
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


def test_a_cve_scored_only_by_cvss_v2_is_graded_by_nvd_v2_ranges_and_gated(project: Path, alma) -> None:
    # NVD entries before 2016 often carry only scorev2 (v3/v4 "0.0"): a v2 10.0 is "high" by
    # NVD's v2 ranges, and, v2 having no critical band, counts toward cve_unpatched_critical
    d = build_deploy(project)
    data = sf.default_cve()
    data["package"][1]["issue"] += [
        sf.issue("CVE-2014-0160", "Unpatched", v2="10.0"),
        sf.issue("CVE-2012-0001", "Unpatched", v2="5.0"),
        sf.issue("CVE-2013-0001", "Patched", v2="3.9", detail="fixed-version"),
    ]
    sf.write_cve(d.dir, LINK, data)
    assert alma("verify", d.dir, "--root", project).code == 0
    f = _facts(project)
    assert f["cve_unpatched_critical"] == 1 and "v2" in _source(project, "cve_unpatched_critical")
    assert f["cve_counts"]["Unpatched"]["high"] == 3 and f["cve_counts"]["Unpatched"]["medium"] == 1
    assert f["cve_counts"]["Patched"]["low"] == 1
    assert "busybox CVE-2014-0160 high (CVSS 2.0 10.0)" in f["cve_unpatched"]
    r = alma("verify", d.dir, "--root", project, "--sbom")
    assert "busybox CVE-2014-0160 high (CVSS 2.0 10.0)" in r.out, r.out


def test_the_grade_takes_the_best_version_present() -> None:
    assert sbom.grade(10.0, 5.0, None) == ("medium", "3.x", 5.0)  # v3 present: v2 is not looked at
    assert sbom.grade(2.0, 9.8, 6.0) == ("medium", "4.0", 6.0)  # v4 beats v3, even when lower
    assert sbom.grade(7.0, 0.0, 0.0) == ("high", "2.0", 7.0)
    assert sbom.grade(3.9, 0.0, 0.0) == ("low", "2.0", 3.9)
    assert sbom.grade(0.0, 0.0, 0.0) == ("none", None, 0.0)


def test_a_waiver_reason_is_read_from_description_not_detail(project: Path, alma) -> None:
    # decode_cve_status: detail is the CVE_STATUS key (always set), description the reason
    d = build_deploy(project)
    data = {"version": "1", "package": [sf.package("zlib", "1.3", [
        sf.issue("CVE-2024-1001", "Ignored", v3="9.8", detail="cpe-incorrect"),
        sf.issue("CVE-2024-1002", "Ignored", v3="9.8", detail="not-applicable-platform", reason="Windows only"),
    ])]}  # fmt: skip
    sf.write_cve(d.dir, LINK, data)
    assert alma("verify", d.dir, "--root", project).code == 0
    f = _facts(project)
    assert f["cve_ignored_without_detail"] == ["zlib CVE-2024-1001"]
    reasons = {i["id"]: i["reason"] for i in f["cve_ignored"]}
    assert reasons == {"CVE-2024-1001": None, "CVE-2024-1002": "Windows only"}
    r = alma("verify", d.dir, "--root", project, "--sbom")
    assert "zlib CVE-2024-1002 not-applicable-platform: Windows only" in r.out, r.out
    assert "without a reason (a finding): 1 zlib CVE-2024-1001" in r.out


def test_supply_chain_files_of_another_build_are_refused_naming_both_stamps(project: Path, alma) -> None:
    d = build_deploy(project)  # the bundle is stamped 20261130120000
    sf.write_cve(d.dir, LINK, stamp="20250101000000")
    r = alma("verify", d.dir, "--root", project)
    assert r.code == 2 and "stamped 20250101000000, but the image's bundle is stamped 20261130120000" in r.err, r.err
    assert not manifest_path(project, "alma-image", MACHINE).exists()


def test_both_sbom_formats_present_this_builds_is_read_and_the_other_named(project: Path, alma) -> None:
    d = build_deploy(project)
    stale = sf.write_spdx3(d.dir, LINK, stamp="20250101000000")  # left by an earlier build with create-spdx-3.0
    sf.write_spdx22(d.dir, LINK)
    assert alma("verify", d.dir, "--root", project).code == 0
    assert _facts(project)["sbom_format"] == "SPDX-2.2"
    assert f"also present, not read: {stale.name}" in _source(project, "sbom_format")


def test_one_package_with_two_licences_is_refused_naming_both(project: Path, alma) -> None:
    d = build_deploy(project)
    tar = sf.spdx22_tar({"zlib": "Zlib"}, more={"zz-other": {"zlib": "LicenseRef-Proprietary"}})
    sf.write_spdx22(d.dir, LINK, tar_bytes=tar)
    r = alma("verify", d.dir, "--root", project)
    assert r.code == 2 and "package 'zlib' has two licences: 'Zlib' in zlib.spdx.json" in r.err, r.err
    assert "'LicenseRef-Proprietary' in zz-other.spdx.json" in r.err


def test_a_wrong_typed_licence_is_refused_not_turned_into_noassertion(project: Path, alma) -> None:
    d = build_deploy(project)
    sf.write_spdx22(d.dir, LINK, tar_bytes=sf.spdx22_tar({}, more={"zlib": {"zlib": ["Zlib", "MIT"]}}))
    r = alma("verify", d.dir, "--root", project)
    assert r.code == 2 and "licenseDeclared ['Zlib', 'MIT'] is not text" in r.err, r.err


def test_an_spdx3_licence_relationship_to_a_missing_id_is_refused(project: Path, alma) -> None:
    d = build_deploy(project)
    graph = sf.spdx3_graph({"zlib": "Zlib"})
    rel = next(o for o in graph["@graph"] if o["type"] == "Relationship")
    rel["to"] = [f"{sf.NS}/lic-gone"]
    sf.write_spdx3(d.dir, LINK, raw=json.dumps(graph).encode())
    r = alma("verify", d.dir, "--root", project)
    assert r.code == 2 and f"refers to missing id(s): {sf.NS}/lic-gone" in r.err, r.err


def test_licence_refs_and_proprietary_licences_are_listed_for_the_gates(project: Path, alma) -> None:
    d = build_deploy(project)
    sf.write_spdx3(d.dir, LINK, {**sf.LICENCES, "nvidia-firmware": "LicenseRef-NVIDIA-Software-License"})
    assert alma("verify", d.dir, "--root", project).code == 0
    assert _facts(project)["licence_proprietary"] == ["nvidia-firmware", "tegra-binaries"]


def test_spdx3_packages_are_counted_by_id_and_one_name_with_two_licences_is_refused(project: Path, alma) -> None:
    d = build_deploy(project)
    graph = sf.spdx3_graph({"zlib": "Zlib", "zlib2": "Zlib"})
    for o in graph["@graph"]:
        if o.get("name") == "zlib2":
            o["name"] = "zlib"  # two installed packages (two ids), one name
    sf.write_spdx3(d.dir, LINK, raw=json.dumps(graph).encode())
    assert alma("verify", d.dir, "--root", project).code == 0
    assert _facts(project)["sbom_package_count"] == 2
    for o in graph["@graph"]:
        if o.get("simplelicensing_licenseExpression") == "Zlib":
            o["simplelicensing_licenseExpression"] = "MIT"
            break
    for p in (d.dir / f"{LINK}.spdx.json", *d.dir.glob(f"{LINK}-*.spdx.json")):
        p.unlink()
    sf.write_spdx3(d.dir, LINK, raw=json.dumps(graph).encode())
    r = alma("verify", d.dir, "--root", project)
    assert r.code == 2 and "package 'zlib' has two licences" in r.err, r.err


def _source(project: Path, name: str) -> str:
    return load_manifest(manifest_path(project, "alma-image", MACHINE)).fact(name).source


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
    "not UTF-8": (
        '{"@context": "https://spdx.org/rdf/3.0.1/spdx-context.jsonld", "@graph": ["caf\udce9"]}',
        "not UTF-8",
    ),
    "deep": ('{"@graph": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    "graph item of the wrong type": (
        json.dumps({"@context": sf.SPDX3_CONTEXT, "@graph": [7]}),
        "@graph[0] is not an object",
    ),
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
    sf.write_spdx3(d.dir, LINK, raw=text.encode("utf-8", "surrogateescape"))
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


# --- the SPDX 2.2 tarball as bitbake really writes it, and as an attacker would --------------


def _frames(*parts: bytes) -> bytes:
    """Independent zstd frames back to back: what pzstd writes (one frame per chunk)."""
    import zstandard

    return b"".join(zstandard.ZstdCompressor().compress(p) for p in parts)


def test_spdx22_written_by_pzstd_in_several_frames_is_read_whole(project: Path, alma, tmp_path: Path) -> None:
    """bitbake compresses the tarball with `pzstd -p BB_NUMBER_THREADS` when pzstd is on the host
    (it is in oe-core's HOSTTOOLS; bitbake lib/bb/compress/zstd.py), which writes one zstd frame
    per chunk. A reader that stops at the first frame saw a truncated tar (exit 2 on a real
    build); the real pzstd makes the file here."""
    import shutil
    import subprocess

    import zstandard

    require_part("pzstd", shutil.which("pzstd") is not None)
    licences = {f"pkg{i:05d}-{'x' * 40}": "MIT" for i in range(9000)} | sf.LICENCES
    tar = tmp_path / "sbom.tar"
    tar.write_bytes(sf.spdx22_tar(licences))
    assert tar.stat().st_size > 9 << 20  # over pzstd's chunk, so more than one frame
    subprocess.run(["pzstd", "-q", "-p", "2", str(tar), "-o", str(tmp_path / "sbom.tar.zst")], check=True)
    raw = (tmp_path / "sbom.tar.zst").read_bytes()
    first_frame = zstandard.ZstdDecompressor().stream_reader(raw).read(tar.stat().st_size)
    assert len(first_frame) < tar.stat().st_size  # the control: it really is several frames
    d = build_deploy(project)
    sf.write_spdx22(d.dir, LINK, raw=raw)
    r = alma("verify", d.dir, "--root", project)
    assert r.code == 0, r.err
    f = _facts(project)
    assert f["sbom_package_count"] == len(licences) and f["licence_proprietary"] == ["tegra-binaries"]


def _member(name: str, body: bytes, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = len(body), kind
    return info.tobuf(tarfile.USTAR_FORMAT) + body + b"\0" * (-len(body) % 512)


def _index(*names: str) -> bytes:
    return _member("index.json", json.dumps({"documents": [{"filename": n} for n in names]}).encode())


def _doc(name: str) -> bytes:
    return json.dumps({"packages": [{"SPDXID": f"SPDXRef-Package-{name}", "name": name}]}).encode()


HOSTILE_SPDX22_MEMBERS = {
    "member not UTF-8": (_member("a.spdx.json", b'{"name": "caf\xe9"}'), "not UTF-8"),
    "member nested deeply": (_member("a.spdx.json", b"[" * 100_000 + b"]" * 100_000), "nested too deeply"),
    "member NaN": (_member("a.spdx.json", b'{"packages": [], "x": NaN}'), "NaN is not a JSON number"),
    "packages of the wrong type": (_member("a.spdx.json", b'{"packages": {"a": 1}}'), "a.spdx.json: not SPDX 2.2"),
    "package name of the wrong type": (
        _member("a.spdx.json", b'{"packages": [{"SPDXID": "SPDXRef-Package-a", "name": 7}]}'),
        "package SPDXRef-Package-a has no name",
    ),
    "member twice": (_member("a.spdx.json", _doc("a")) * 2, "'a.spdx.json': nested or twice"),
    "nested member": (_member("x/a.spdx.json", _doc("a")), "'x/a.spdx.json': nested or twice"),
    "hard link": (_member("a.spdx.json", b"", tarfile.LNKTYPE), "is not a regular file"),
    "device": (_member("a.spdx.json", b"", tarfile.CHRTYPE), "is not a regular file"),
    "bad size field": (_member("a.spdx.json", _doc("a"))[:124] + b"zzzzzzzzzzz\0" + b"\0" * 376, "bad size field"),
    "truncated member (the stream ends inside it)": (
        _index("a.spdx.json") + _member("a.spdx.json", _doc("a") + b" " * 2000)[:1024],
        "is truncated",
    ),
    "huge pax header": (_member("././@PaxHeader", b"x" * (70 << 10), b"x"), "tar extended header of 71680 bytes"),
    "member over the limit (declared, nothing read)": (
        tarfile.TarInfo("a.spdx.json").tobuf(tarfile.USTAR_FORMAT)[:124]
        + b"%011o\0" % (65 << 20)
        + tarfile.TarInfo("a.spdx.json").tobuf(tarfile.USTAR_FORMAT)[136:],
        "over 64 MiB",
    ),
    "index naming a missing document": (b"", "'a.spdx.json' not in tar"),
}


@pytest.mark.parametrize("case", HOSTILE_SPDX22_MEMBERS)
def test_hostile_spdx22_members_are_exit_2_naming_the_file(project: Path, alma, case: str) -> None:
    body, needle = HOSTILE_SPDX22_MEMBERS[case]
    d = build_deploy(project)
    tail = b"" if body.startswith(_index("a.spdx.json")) else _index("a.spdx.json") + b"\0" * 1024
    sf.write_spdx22(d.dir, LINK, raw=_frames(body + tail))
    r = alma("verify", d.dir, "--root", project)
    assert r.code == 2, (r.out, r.err)
    assert f"{LINK}.spdx.tar.zst" in r.err and needle in r.err, r.err
    assert "internal error" not in r.err and not manifest_path(project, "alma-image", MACHINE).exists()


def test_a_tarball_inflating_past_the_budget_is_refused(project: Path, alma, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sbom, "MAX_TAR_BYTES", 1 << 20)
    d = build_deploy(project)
    sf.write_spdx22(d.dir, LINK, raw=_frames(*[_member(f"d{i}.spdx.json", b"{}" + b" " * 4000) for i in range(400)]))
    r = alma("verify", d.dir, "--root", project)
    assert r.code == 2 and "inflates to more than 1 MiB; refused" in r.err, r.err


@pytest.mark.slow
def test_a_zstd_bomb_costs_bounded_memory_not_its_inflated_size(project: Path, tmp_path: Path) -> None:
    """A ~50 KB .spdx.tar.zst that inflates to 1.2 GiB of valid (whitespace-padded) SPDX
    documents: the real `alma verify` in its own process refuses it (exit 2) at the inflate
    budget with a peak RSS far below the inflated size (the documents are streamed one at a
    time; the reader that read the whole tar into memory first peaked over 1 GiB)."""
    import os
    import subprocess
    import sys

    d = build_deploy(project)
    body = b'{"packages": []}' + b" " * ((60 << 20) - 16)  # 60 MiB: a multiple of 512, no padding
    body_frame = _frames(body)  # compressed once; each member is its own header frame + this one
    frames = b"".join(_frames(_member(f"d{i}.spdx.json", body)[:512]) + body_frame for i in range(21))
    assert len(frames) < 200_000
    sf.write_spdx22(d.dir, LINK, raw=frames)
    env = dict(os.environ, ALMA_ROOT=str(project), XDG_CACHE_HOME=str(tmp_path / "cache"))
    err = tmp_path / "stderr"
    with err.open("w") as fh:  # os.wait4: the rusage of this child alone, whatever ran before it
        proc = subprocess.Popen(
            [sys.executable, "-m", "alma", "verify", str(d.dir), "--root", str(project)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=fh,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    peak_mb = usage.ru_maxrss / 1024
    assert proc.returncode == 2 and "inflates to more than 1024 MiB; refused" in err.read_text(), err.read_text()
    assert peak_mb < 400, f"peak RSS {peak_mb:.0f} MB for a bomb"


@pytest.mark.parametrize("fmt", ["SPDX-2.2", "SPDX-3.0.1"])
def test_a_package_the_image_does_not_contain_does_not_count(project: Path, alma, fmt: str) -> None:
    """An SBOM carries more than the image: the 2.2 tarball every document the image's refer to
    (recipes, runtime, dependencies), SPDX 3 whatever its elements link to. Only what the image
    package CONTAINS (2.2), or what the rootfs build has as input (3), is the image's."""
    d = build_deploy(project)
    lic = {**sf.LICENCES, "orphan": "GPL-3.0-only"}
    if fmt == "SPDX-2.2":
        sf.write_spdx22(d.dir, LINK, tar_bytes=sf.spdx22_tar(lic, contained=set(sf.LICENCES)))
    else:
        sf.write_spdx3(d.dir, LINK, raw=json.dumps(sf.spdx3_graph(lic, contained=set(sf.LICENCES))).encode())
    assert alma("verify", d.dir, "--root", project).code == 0
    facts = _facts(project)
    assert facts["sbom_format"] == fmt and facts["sbom_package_count"] == len(sf.LICENCES)
    assert "GPL-3.0-only" not in facts["licences"]
    assert "1 package(s) nothing in the image contains not counted" in _source(project, "sbom_package_count")


def test_an_spdx22_contains_to_a_package_no_document_has_is_refused(project: Path, alma) -> None:
    d = build_deploy(project)
    # the same length: the tar's member sizes hold
    tar = sf.spdx22_tar({"zlib": "Zlib"}).replace(b"zlib:SPDXRef-Package-zlib", b"zlib:SPDXRef-Package-gone")
    sf.write_spdx22(d.dir, LINK, tar_bytes=tar)
    r = alma("verify", d.dir, "--root", project)
    assert r.code == 2 and "the image CONTAINS DocumentRef-zlib:SPDXRef-Package-gone" in r.err, r.err


def test_an_spdx3_document_without_the_image_sbom_root_is_refused(project: Path, alma) -> None:
    d = build_deploy(project)
    graph = sf.spdx3_graph(sf.LICENCES)
    graph["@graph"] = [o for o in graph["@graph"] if o["type"] != "software_Sbom"]
    sf.write_spdx3(d.dir, LINK, raw=json.dumps(graph).encode())
    r = alma("verify", d.dir, "--root", project)
    assert r.code == 2 and "no software_Sbom with a rootElement" in r.err, r.err
