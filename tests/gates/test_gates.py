"""alma gates check / render: claims in gate documents against the facts manifest."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from artefacts.alma_deployfix import build_deploy
from support import REPO

from alma.artefacts.manifest import Manifest, manifest_path
from alma.artefacts.verify import ARTEFACT_FACTS
from alma.flash import records

MACHINE, IMAGE = "jetson-orin-nano-devkit", "alma-image"
SHA = "ab" * 32

LAB = {  # the lab's first ALMA-OS build (docs/architecture.md, "What the toolchain encodes from the field")
    "image_buildable": True,
    "kernel_version": "5.15.185-l4t-r36.5-1033.33+g9c6d5c8154",
    "kernel_image_bytes": 41_287_168,
    "bundle_bytes": 1_600_000_000,
    "bundle_sha256": SHA,
    "package_count": 812,
    "components": {"alma-guard": True, "alma-health": True, "alma-watchdog-config": True, "eran-grid": False},
}


def write_manifest(root: Path, **facts: Any) -> Path:
    m = Manifest(MACHINE, IMAGE, generated="2026-11-30T12:00:00Z")
    for name in ARTEFACT_FACTS:
        m.set(name, None, "test: unknown")
    for name, value in {**LAB, **facts}.items():
        m.set(name, value, f"test fixture: {name}")
    path = manifest_path(root, IMAGE, MACHINE)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(m.to_json())
    return path


def write_doc(root: Path, body: str, name: str = "alma-os.md", claims: str = "", head: str = "") -> Path:
    p = root / "docs" / "gates" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    text = f"---\ngate: alma-os\nmachine: {MACHINE}\nimage: {IMAGE}\n{head}"
    if claims:
        text += "claims:\n" + "".join(f"  {line}\n" for line in claims.strip().splitlines())
    p.write_text(text + "---\n" + body)
    return p


def record(root: Path, sha: str, boot: bool = False) -> None:
    records.save(
        records.FlashRecord(
            board={"usb_instance": "1-8.4", "vendor": "0955", "product": "7523"},
            bundle_sha256=sha,
            bundle_path="/deploy/alma-image-jetson-orin-nano-devkit.rootfs-20261130120000.tegraflash.tar.gz",
            machine=MACHINE,
            started="2026-11-30T13:00:00Z",
            finished="2026-11-30T13:20:00Z",
            result="SUCCESS",
            final_status="SUCCESS",
            exit_code=0,
            boot=records.Boot(seen=True, console="/dev/ttyACM0") if boot else None,
        ),
        root / "facts" / "flash-records",
    )


# --- the field's scenario ---------------------------------------------------------------


def test_doc_saying_cannot_be_built_goes_stale_when_the_bundle_exists(project: Path, alma) -> None:
    doc = write_doc(
        project,
        "# ALMA-OS\n\nThe image <!-- fact:image_buildable -->no<!-- /fact --> (cannot be built on this setup).\n",
        claims="image_buildable: false\nstatus: null",
    )
    d = build_deploy(project)
    assert alma("verify", d.dir).code == 0
    r = alma("gates", "check")
    assert r.code == 1, r.out + r.err
    # doc:line, the claim, the fact, the fact's source, the fix
    assert "docs/gates/alma-os.md:6: stale: image_buildable" in r.out
    assert "docs/gates/alma-os.md:11: stale: image_buildable" in r.out  # the inline marker
    assert "fact:   true" in r.out
    assert f"source: {d.bundle}: a flashable bundle exists" in r.out
    assert "fix:    alma gates render --write docs/gates/alma-os.md" in r.out
    assert "docs/gates/alma-os.md:7: stale: status" in r.out and "Prototype" in r.out
    assert "docs/gates/alma-os.md:11: warning: unmarked claim 'cannot be built'" in r.out
    assert "STALE" in r.err
    # and the fix fixes it
    assert alma("gates", "render", "--write").code == 0
    text = doc.read_text()
    assert "image_buildable: true" in text and "status: Prototype" in text
    assert "<!-- fact:image_buildable -->yes<!-- /fact -->" in text
    assert alma("gates", "check").code == 0


def test_fresh_doc_passes(project: Path, alma) -> None:
    write_manifest(project)
    write_doc(
        project,
        "Kernel <!-- fact:kernel_version -->5.15.185-l4t-r36.5<!-- /fact -->, image "
        "<!-- fact:kernel_image_bytes -->41 MB<!-- /fact -->, bundle <!-- fact:bundle_bytes -->1.6 GB<!-- /fact -->.\n"
        "Hash <!-- fact:bundle_sha256 | short(8) -->abababab<!-- /fact -->, "
        "<!-- fact:package_count -->812<!-- /fact --> packages, "
        "guard: <!-- fact:components.alma-guard -->yes<!-- /fact -->\n",
        claims="image_buildable: true\nkernel_version: 5.15.185\nbundle_bytes: 1.6 GB\nkernel_image_bytes: ~41 MB\n"
        "status: Prototype\nflashed: false\ncomponents:\n  alma-guard: true\n  eran-grid: false",
    )
    r = alma("gates", "check")
    assert r.code == 0, r.out + r.err
    assert "14 hold, 0 stale" in r.err
    assert alma("gates", "check", "--strict").code == 0


@pytest.mark.parametrize(
    ("nbytes", "code"),
    [
        (1_550_000_000, 0),
        (1_650_000_000, 0),
        (1_600_000_000, 0),
        (1_540_000_000, 1),
        (1_660_000_000, 1),
        (1_549_999_999, 1),
        (1_650_000_001, 1),
    ],
)
def test_size_tolerance_edges(project: Path, alma, nbytes: int, code: int) -> None:
    write_manifest(project, bundle_bytes=nbytes)
    write_doc(project, "Bundle: <!-- fact:bundle_bytes -->1.6 GB<!-- /fact -->.\n", claims="bundle_bytes: 1.6 GB")
    r = alma("gates", "check")
    assert r.code == code, r.out
    if code:
        assert "1.6 GB" in r.out and f"{nbytes} bytes" in r.out


def test_binary_units_and_exact_bytes(project: Path, alma) -> None:
    write_manifest(project, bundle_bytes=int(1.6 * 2**30))
    write_doc(project, "x\n", claims="bundle_bytes: 1.6G\nkernel_image_bytes: 41287168\nrootfs_bytes: null")
    assert alma("gates", "check").code == 0
    write_doc(project, "x\n", claims="kernel_image_bytes: 41287169")
    assert alma("gates", "check").code == 1


def test_version_prefix_holds_only_at_a_boundary(project: Path, alma) -> None:
    write_manifest(project)
    for claim, code in (("5.15.185", 0), ("5.15.185-l4t-r36.5", 0), ("5.15.18", 1), ("5.15.186", 1), ("5.10", 1)):
        write_doc(project, "x\n", claims=f"kernel_version: {claim}")
        assert alma("gates", "check").code == code, claim


# --- cannot judge: exit 2 ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("# no front matter\n", "no YAML front matter"),
        ("---\ngate: x\nmachine: m\nimage: i\nclaims:\n  status: Prototype\n", "not closed"),
        ("---\ngate: [unclosed\n---\nbody\n", "not valid YAML"),
        ("---\nmachine: m\nimage: i\nclaims:\n  status: null\n---\n", "needs gate"),
        ("---\ngate: g\nmachine: m\nimage: i\nclaim:\n  status: null\n---\n", "unknown front matter key(s): claim"),
        ("---\ngate: g\nmachine: m\nimage: i\nclaims: [status]\n---\n", "claims: must be a mapping"),
        ("---\ngate: g\nmachine: m\nimage: i\n---\nno claims here\n", "makes no checkable claim"),
        ("---\ngate: g\nmachine: m\nimage: i\n---\nx <!-- fact:status -->Prototype\n", "unmatched fact marker"),
        ("---\ngate: g\nmachine: m\nimage: i\nclaims:\n  status: Released\n---\n", "'Released' is not one of"),
        ("---\ngate: g\nmachine: m\nimage: i\nclaims:\n  bundle_bytes: big\n---\n", "not a valid size"),
    ],
)
def test_malformed_documents(project: Path, alma, text: str, needle: str) -> None:
    write_manifest(project)
    (project / "docs" / "gates" / "bad.md").write_text(text)
    r = alma("gates", "check")
    assert r.code == 2, r.out
    assert needle in r.out


def test_unknown_claim(project: Path, alma) -> None:
    write_manifest(project)
    write_doc(project, "x\n", claims="image_buildable: true\nboots_fast: true")
    r = alma("gates", "check")
    assert r.code == 2
    assert "docs/gates/alma-os.md:7: unknown claim 'boots_fast'" in r.out
    write_doc(project, "x <!-- fact:vibes -->good<!-- /fact -->\n")
    assert "unknown claim 'vibes'" in alma("gates", "check").out


def test_missing_manifest_is_never_a_pass(project: Path, alma) -> None:
    write_doc(project, "x\n", claims="status: null")
    r = alma("gates", "check")
    assert r.code == 2
    assert "facts manifest not found" in r.out and "alma verify" in r.out
    r = alma("gates", "render", "--write")
    assert r.code == 2 and "facts manifest not found" in r.err


def test_malformed_manifest(project: Path, alma) -> None:
    write_doc(project, "x\n", claims="status: null")
    manifest_path(project, IMAGE, MACHINE).write_text('{"schema": "alma.facts/1", "machine": "m"')
    assert alma("gates", "check").code == 2
    manifest_path(project, IMAGE, MACHINE).write_text(json.dumps({"schema": "alma.facts/0"}))
    assert "schema" in alma("gates", "check").out


def test_no_documents_is_an_error(project: Path, alma) -> None:
    assert alma("gates", "check").code == 2
    assert alma("gates", "check", project / "docs" / "gates" / "nope.md").code == 2


def test_one_bad_doc_does_not_hide_a_stale_one(project: Path, alma) -> None:
    write_manifest(project)
    write_doc(project, "x\n", claims="image_buildable: false")
    (project / "docs" / "gates" / "bad.md").write_text("nothing\n")
    r = alma("gates", "check", "--json")
    data = json.loads(r.out)
    assert r.code == 2 and data["exit_code"] == 2
    assert data["counts"]["stale"] == 1 and data["counts"]["error"] == 1


# --- status labels from flash records ------------------------------------------------------


def test_doc_claiming_flashed_without_a_record_is_stale(project: Path, alma) -> None:
    write_manifest(project)
    write_doc(project, "Status: <!-- fact:status -->Flashed<!-- /fact -->\n", claims="status: Flashed\nflashed: true")
    r = alma("gates", "check")
    assert r.code == 1
    assert "docs/gates/alma-os.md:6: stale: status: the doc says 'Flashed', the facts say Prototype" in r.out
    assert "0 flash record(s)" in r.out
    record(project, "cd" * 32)  # a record for some other bundle does not back it
    assert alma("gates", "check").code == 1
    record(project, SHA)
    assert alma("gates", "check").code == 0
    write_doc(project, "x\n", claims="status: Booted\nbooted: true")
    assert alma("gates", "check").code == 1
    record(project, SHA, boot=True)
    assert alma("gates", "check").code == 0


@pytest.mark.parametrize(
    ("field", "bad", "needle"),
    [
        ("started", 5, "started: must be a string, not an integer"),  # crashed sorting (exit 70)
        ("result", ["SUCCESS"], "result: must be"),
        ("exit_code", 1.5, "exit_code: must be an integer"),
        ("boot", {"seen": "yes"}, "boot.seen: must be true or false"),  # "yes" read as Booted
        ("phases", [{"name": "flash", "started": 0}], "phases.1.started: must be a string"),
        ("board", "1-8.4", "board: must be a table"),
    ],
)
def test_a_record_with_a_wrong_typed_field_is_a_config_error(
    project: Path, alma, field: str, bad: object, needle: str
) -> None:
    write_manifest(project)
    write_doc(project, "Status: <!-- fact:status -->Booted<!-- /fact -->\n", claims="status: Booted\nbooted: true")
    record(project, SHA, boot=True)
    [good] = (project / "facts" / "flash-records").glob("*.json")
    data = json.loads(good.read_text())
    data[field] = bad
    bad_path = good.with_name("z-hand-edited.json")
    bad_path.write_text(json.dumps(data))
    r = alma("gates", "check")
    assert r.code == 2, r.out
    assert f"{bad_path}: {needle}" in r.out and "Traceback" not in r.out


def test_unbacked_claim_against_the_absent_manifest(project: Path, alma) -> None:
    assert alma("verify", "--absent").code == 0
    write_doc(project, "x\n", claims="image_buildable: false")
    r = alma("gates", "check")
    assert r.code == 1
    assert "unbacked: image_buildable" in r.out and "cannot back it" in r.out


# --- unmarked prose ---------------------------------------------------------------------


def test_unmarked_claims_warn_and_strict_fails(project: Path, alma) -> None:
    write_manifest(project)
    write_doc(
        project,
        "Kernel 5.15.185-l4t-r36.5 was not yet flashed.\n"
        "The bundle is about 1.6 GB. <!-- fact:bundle_bytes -->1.6 GB<!-- /fact -->\n"
        "Kernel <!-- fact:kernel_version -->5.15.185<!-- /fact --> is marked.\n"
        "It cannot be built here, honestly. <!-- gates:ignore -->\n",
    )
    r = alma("gates", "check")
    assert r.code == 0, r.out
    assert "alma-os.md:6: warning: unmarked claim '5.15.185-l4t-r36.5' (pattern kernel-version)" in r.out
    assert "alma-os.md:6: warning: unmarked claim 'not yet flashed'" in r.out
    assert "alma-os.md:7: warning: unmarked claim '1.6 GB'" in r.out
    assert ":8:" not in r.out and ":9:" not in r.out
    r = alma("gates", "check", "--strict")
    assert r.code == 2 and "alma-os.md:6: error: unmarked claim" in r.out


def test_patterns_are_configurable(project: Path, alma) -> None:
    write_manifest(project)
    write_doc(project, "It is ready to flash, about 1.6 GB.\n", claims="status: Prototype")
    (project / "docs" / "gates" / "patterns.toml").write_text(
        '[[pattern]]\nname = "ready"\nregex = \'(?i)\\bready to flash\\b\'\nclaim = "status"\n'
        'message = "say it with the status label"\n\n[[pattern]]\nname = "size"\nenabled = false\n'
    )
    r = alma("gates", "check", "--strict")
    assert r.code == 2
    assert "unmarked claim 'ready to flash' (pattern ready: say it with the status label)" in r.out
    assert "1.6 GB" not in r.out
    (project / "docs" / "gates" / "patterns.toml").write_text("replace = true\n")
    assert alma("gates", "check", "--strict").code == 0
    (project / "docs" / "gates" / "patterns.toml").write_text("[[pattern]]\nname = 'x'\nregex = '('\n")
    assert "bad regex" in alma("gates", "check").out


# --- render -----------------------------------------------------------------------------


def test_render_diff_then_write(project: Path, alma) -> None:
    write_manifest(project, bundle_bytes=1_712_000_000)
    doc = write_doc(
        project,
        "Bundle <!-- fact:bundle_bytes -->1.6 GB<!-- /fact -->, kernel "
        "<!-- fact:kernel_version -->5.15.185-l4t-r36.5<!-- /fact -->, "
        "hash <!-- fact:bundle_sha256 | short(8) -->00000000<!-- /fact -->.\n",
        claims="image_buildable: false  # stale since the first build\nbundle_bytes: 1.55 GiB\n"
        "kernel_version: 5.15.185\npackage_count: 700\ncomponents:\n  eran-grid: true",
    )
    before = doc.read_text()
    r = alma("gates", "render")
    assert r.code == 0
    assert doc.read_text() == before  # without --write nothing changes
    assert "--- a/docs/gates/alma-os.md" in r.out and "+++ b/docs/gates/alma-os.md" in r.out
    assert "-  image_buildable: false  # stale since the first build" in r.out
    assert "+  image_buildable: true  # stale since the first build" in r.out
    assert "+  bundle_bytes: 1.59 GiB" in r.out  # the author's unit and precision
    assert "+  package_count: 812" in r.out and "+    eran-grid: false" in r.out
    assert "<!-- fact:bundle_bytes -->1.7 GB<!-- /fact -->" in r.out
    assert "<!-- fact:bundle_sha256 | short(8) -->abababab<!-- /fact -->" in r.out
    assert "-  kernel_version" not in r.out and "+  kernel_version" not in r.out  # holds: left as written
    assert alma("gates", "check").code == 1
    assert alma("gates", "render", "--write").code == 0
    after = doc.read_text()
    assert "5.15.185-l4t-r36.5<!-- /fact -->" in after and "  kernel_version: 5.15.185\n" in after
    assert alma("gates", "check").code == 0
    assert "up to date" in alma("gates", "render").err


def test_render_to_unknown(project: Path, alma) -> None:
    assert alma("verify", "--absent").code == 0
    doc = write_doc(project, "Kernel <!-- fact:kernel_version -->5.15.185<!-- /fact -->\n", claims="flashed: true")
    assert alma("gates", "render", "--write").code == 0
    text = doc.read_text()
    assert "flashed: null" in text and "<!-- fact:kernel_version -->unknown<!-- /fact -->" in text
    assert alma("gates", "check").code == 0


# --- the repository's own gate ------------------------------------------------------------


def test_repo_gate_holds_against_the_committed_manifest(tmp_path: Path, alma) -> None:
    r = alma("gates", "check", "--strict", "--root", REPO)
    assert r.code == 0, r.out + r.err


def test_repo_gate_goes_stale_the_moment_a_real_build_is_verified(project: Path, alma) -> None:
    shutil.copy(REPO / "docs" / "gates" / "alma-os.md", project / "docs" / "gates" / "alma-os.md")
    shutil.copy(REPO / "facts" / f"{IMAGE}-{MACHINE}.json", project / "facts")
    assert alma("gates", "check").code == 0
    d = build_deploy(project)
    assert alma("verify", d.dir).code == 0
    r = alma("gates", "check")
    assert r.code == 1
    for claim in ("image_buildable", "kernel_version", "bundle_bytes", "bundle_sha256", "status"):
        assert f"stale: {claim}" in r.out, claim
    assert hashlib.sha256(d.bundle.read_bytes()).hexdigest() in r.out
