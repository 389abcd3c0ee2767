"""Gates that cannot be talked down: a reviewer's limits (front matter ``policy:``) are judged
like claims but never rewritten by `alma gates render --write`, and the fix printed for a
breach is to fix the build or raise the limit by hand; claims are typed (no "2" for a time,
no "5" for a kernel, no "0 TB" for a size); the list facts can be claimed; an unknown claim
names the claims that exist."""

from __future__ import annotations

from pathlib import Path

import pytest
from gates.test_gates import write_doc, write_manifest


def test_a_breached_policy_is_never_rewritten_and_the_fix_is_the_build(project: Path, alma) -> None:
    write_manifest(project, cve_unpatched_critical=3, cve_blind_spots_critical=["tegra-binaries"])
    doc = write_doc(
        project,
        "No unpatched critical CVE.\n",
        head="policy:\n  cve_unpatched_critical: 0\n  cve_blind_spots_critical: []\n",
    )
    before = doc.read_text()
    r = alma("gates", "check")
    assert r.code == 1, (r.out, r.err)
    assert "cve_unpatched_critical: the policy says '0', the facts say 3" in r.out
    assert "fix the build" in r.out and "raise the limit by hand" in r.out
    assert "render --write" not in r.out.replace("render never rewrites", "")
    r = alma("gates", "render", "--write")
    assert doc.read_text() == before  # the reviewer's limits stand
    assert alma("gates", "check").code == 1


@pytest.mark.parametrize(
    ("claim", "why"),
    [
        ('build_time: "2"', "not a valid time"),
        ("build_time: 2", "not a valid time"),
        ('kernel_version: "5"', "not a valid version"),
        ("bundle_bytes: 0 TB", "too coarse"),
        ("bundle_bytes: 2 GB", "too coarse"),
        ("cve_blind_spots: none of them", "not a valid data"),
    ],
)
def test_claims_are_typed(project: Path, alma, claim: str, why: str) -> None:
    write_manifest(project, build_time="2026-06-18T10:00:00Z", kernel_version="5.15.185", bundle_bytes=1_600_000_000)
    write_doc(project, "x\n", claims=claim)
    r = alma("gates", "check")
    assert r.code == 2 and why in r.out + r.err, (r.out, r.err)


def test_typed_claims_that_mean_something_hold(project: Path, alma) -> None:
    write_manifest(project, build_time="2026-06-18T10:00:00Z", kernel_version="5.15.185", bundle_bytes=1_600_000_000)
    write_doc(project, "x\n", claims="build_time: 2026-06-18\nkernel_version: 5.15\nbundle_bytes: 1.6 GB")
    r = alma("gates", "check")
    assert r.code == 0, (r.out, r.err)


def test_list_facts_can_be_claimed(project: Path, alma) -> None:
    write_manifest(project, licence_proprietary=["tegra-binaries"], cve_ignored_without_detail=[])
    write_doc(project, "x\n", claims='licence_proprietary: ["tegra-binaries"]\ncve_ignored_without_detail: []')
    assert alma("gates", "check").code == 0
    write_manifest(project, licence_proprietary=["tegra-binaries", "nvidia-firmware"], cve_ignored_without_detail=[])
    r = alma("gates", "check")
    assert r.code == 1 and "licence_proprietary" in r.out


def test_an_unknown_claim_lists_the_claims_that_exist(project: Path, alma) -> None:
    write_manifest(project)
    write_doc(project, "x\n", claims="cve_unpatched_criticl: 0")
    r = alma("gates", "check")
    assert r.code == 2 and "unknown claim 'cve_unpatched_criticl'" in r.out + r.err
    assert "the claims that exist:" in r.out + r.err and "cve_unpatched_critical" in r.out + r.err
