"""The seam between `alma build`, `alma verify` and the gate docs: one build tree.

The deploy dir is placed where the real tools put it, derived from what kas was told
(KAS_BUILD_DIR = bitbake's TOPDIR, recorded by the fake bitbake as its cwd) and oe-core's
own rule (TMPDIR = ${TOPDIR}/tmp-glibc for a non-poky distro), never from alma's code.
"""

from __future__ import annotations

import re
from pathlib import Path

from artefacts.alma_deployfix import build_deploy
from support_build import read_record

from alma.artefacts.manifest import load_manifest, manifest_path
from alma.buildtree import deploy_dir_hint
from alma.ground import utc_iso

REPO = Path(__file__).resolve().parents[2]


def test_verify_with_no_path_finds_what_build_made(project, fakes, probes, alma):
    code, out, err = alma("build", "--machine", "jetson-agx-orin-devkit")
    assert code == 0, out + err
    [bb] = [c for c in read_record(fakes) if c["tool"] == "bitbake"]
    build_deploy(project, "jetson-agx-orin-devkit", topdir=Path(bb["cwd"]))
    code, out, err = alma("verify")
    assert code == 0, out + err
    m = load_manifest(manifest_path(project, "alma-image", "jetson-agx-orin-devkit"))
    assert m.value("env_machine") == "jetson-agx-orin-devkit"
    assert m.value("bundle_path").startswith(bb["cwd"] + "/tmp-glibc/deploy/images/jetson-agx-orin-devkit/")


def test_verify_reads_the_nvd_date_from_the_download_dir_the_build_used(project, fakes, probes, alma, tmp_path):
    # the build's DL_DIR came from a kas file's env: (or an export gone by verify time)
    from artefacts import sbomfix as sf

    dl = tmp_path / "shared-downloads"
    (project / "kas" / "local").mkdir(exist_ok=True)
    (project / "kas" / "local" / "dl.yml").write_text(f"header:\n  version: 14\nenv:\n  DL_DIR: {dl}\n")
    code, out, err = alma("build", "--kas-file", "kas/local/dl.yml")
    assert code == 0, out + err
    [bb] = [c for c in read_record(fakes) if c["tool"] == "bitbake"]
    assert bb["env"]["DL_DIR"] == str(dl)
    d = build_deploy(project, topdir=Path(bb["cwd"]))
    sf.write_cve(d.dir, "alma-image-jetson-orin-nano-devkit.rootfs")
    sf.write_nvd_db(dl, 1_795_000_000)
    sf.write_nvd_db(project / "build" / "downloads", 1_700_000_000)  # a stale copy where the default points
    code, out, err = alma("verify")
    assert code == 0, out + err
    m = load_manifest(manifest_path(project, "alma-image", "jetson-orin-nano-devkit"))
    assert m.value("nvd_data_date") == utc_iso(1_795_000_000) and str(dl) in m.fact("nvd_data_date").source


def test_absent_refuses_after_a_build(project, fakes, probes, alma):
    code, out, err = alma("build")
    assert code == 0, out + err
    [bb] = [c for c in read_record(fakes) if c["tool"] == "bitbake"]
    build_deploy(project, topdir=Path(bb["cwd"]))
    code, out, err = alma("verify", "--absent")
    assert code == 2 and "refusing to record that nothing is built" in err
    assert not manifest_path(project, "alma-image", "jetson-orin-nano-devkit").exists()


def test_docs_name_the_deploy_dir_build_uses():
    """Every deploy path the docs and gate documents write is the build tree's."""
    wrong = []
    for doc in sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]:
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for m in re.finditer(r"build/[\w<>./-]*deploy/images/([\w<>-]+)", line):
                machine = m.group(1)
                if m.group(0) != deploy_dir_hint(machine):
                    wrong.append(f"{doc.relative_to(REPO)}:{n}: {m.group(0)} (want {deploy_dir_hint(machine)})")
    assert not wrong, "\n".join(wrong)
