"""alma verify against realistic meta-tegra scarthgap deploy dirs (see alma_deployfix)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from artefacts.alma_deployfix import KREL, MACHINES, build_deploy, kernel_bytes, make_bundle

from alma.artefacts.cache import default_cache_file
from alma.artefacts.kernel import read_kernel
from alma.artefacts.manifest import load_manifest, manifest_path
from alma.errors import UserError
from alma.flash import records

IMAGE = "alma-image"


def _manifest(project: Path, machine: str):  # type: ignore[no-untyped-def]
    return load_manifest(manifest_path(project, IMAGE, machine))


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_verify_reads_every_fact_with_its_source(project: Path, alma, machine: str) -> None:
    d = build_deploy(project, machine)
    r = alma("verify", d.dir, "--root", project)
    assert r.code == 0, r.err
    m = _manifest(project, machine)
    assert m.schema == "alma.facts/1" and m.machine == machine and m.image == IMAGE
    f = {k: v.value for k, v in m.facts.items()}
    assert f["image_buildable"] is True
    assert f["kernel_version"] == KREL
    assert f["kernel_banner"].startswith(f"Linux version {KREL} (oe-user@oe-host)")
    assert f["kernel_image_bytes"] == d.kernel.stat().st_size
    assert f["bundle_sha256"] == hashlib.sha256(d.bundle.read_bytes()).hexdigest()
    assert f["bundle_bytes"] == d.bundle.stat().st_size
    assert f["bundle_path"] == str(d.bundle)  # the timestamped real file, not the link
    assert f["rootfs_bytes"] == (d.dir / f"{IMAGE}-{machine}.rootfs-20261130120000.ext4").stat().st_size
    assert f["build_time"] == "2026-11-30T12:00:00Z"
    bootdev, rootdev, _ = MACHINES[machine]
    assert (f["env_machine"], f["env_chipid"], f["env_bootdev"], f["env_rootfs_device"]) == (
        machine,
        "0x23",
        bootdev,
        rootdev,
    )
    assert f["package_count"] == 11
    assert f["components"] == {"alma-guard": True, "alma-health": True, "alma-watchdog-config": True, "eran-grid": True}
    assert f["status"] == "Prototype" and f["flashed"] is False and f["booted"] is False
    for name, fact in m.facts.items():
        assert isinstance(fact.source, str) and fact.source, name
    assert m.facts["env_machine"].source.endswith(":.env.initrd-flash")
    assert "DATETIME" in m.facts["build_time"].source


def test_default_deploy_dir_and_machine(project: Path, alma) -> None:
    build_deploy(project, "jetson-orin-nano-devkit-nvme")
    r = alma("verify", "--machine", "jetson-orin-nano-devkit-nvme", "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["facts"]["env_rootfs_device"]["value"] == "nvme0n1"
    assert manifest_path(project, IMAGE, "jetson-orin-nano-devkit-nvme").is_file()


def test_gzipped_kernel_image(project: Path, alma) -> None:
    d = build_deploy(project, gz_kernel=True)
    assert d.kernel.read_bytes()[:2] == b"\x1f\x8b"
    assert alma("verify", d.dir).code == 0
    m = _manifest(project, d.machine)
    assert m.value("kernel_version") == KREL
    assert "(gzip)" in m.fact("kernel_version").source


def test_banner_across_a_read_boundary(tmp_path: Path) -> None:
    for at in ((1 << 20) - 30, (1 << 20) + 5, 2 << 20):
        p = tmp_path / f"Image-{at}"
        p.write_bytes(kernel_bytes("5.15.185-l4t-r36.5-1033.33", size=3 << 20, banner_at=at))
        kf = read_kernel(p)
        assert kf.release == "5.15.185-l4t-r36.5-1033.33"
        assert kf.arm64_image and not kf.compressed
    gz = tmp_path / "Image.gz"
    gz.write_bytes(gzip.compress(kernel_bytes("6.1.0-test", banner_at=(1 << 20) - 3)))
    assert read_kernel(gz).release == "6.1.0-test"


def test_kernel_image_without_banner_is_an_error(tmp_path: Path) -> None:
    p = tmp_path / "Image"
    p.write_bytes(os.urandom(100_000) + b"Linux version %s (%s)\n")  # only the format string
    with pytest.raises(UserError, match="no 'Linux version' banner"):
        read_kernel(p)


def _fails(r, *needles: str) -> None:  # type: ignore[no-untyped-def]
    assert r.code == 2, (r.out, r.err)
    for n in needles:
        assert n in r.err, r.err
    assert "try:" in r.err


def test_dangling_bundle_symlink(project: Path, alma) -> None:
    d = build_deploy(project)
    d.bundle.unlink()
    r = alma("verify", d.dir)
    _fails(r, "dangling symlink", d.bundle_link.name)
    assert not manifest_path(project, IMAGE, d.machine).exists()


def test_dangling_kernel_symlink(project: Path, alma) -> None:
    d = build_deploy(project)
    d.kernel.unlink()
    _fails(alma("verify", d.dir), "dangling symlink", "Image-jetson-orin-nano-devkit.bin")


def test_bundle_for_another_machine(project: Path, alma) -> None:
    d = build_deploy(project, env_machine="jetson-agx-orin-devkit")
    _fails(alma("verify", d.dir), "wrong machine", "MACHINE='jetson-agx-orin-devkit'")
    assert not manifest_path(project, IMAGE, d.machine).exists()


def test_manifest_kernel_differs_from_image_banner(project: Path, alma) -> None:
    d = build_deploy(project, manifest_release="5.15.148-l4t-r36.4-1012.12+gabcdef0123")
    _fails(alma("verify", d.dir), "kernel mismatch", "kernel-5.15.148-l4t-r36.4", f"Linux version {KREL}")


def test_no_bundle_at_all(project: Path, alma) -> None:
    d = build_deploy(project)
    d.bundle_link.unlink()
    d.bundle.unlink()
    _fails(alma("verify", d.dir), "no bundle")


def test_bundle_without_env_file(project: Path, alma) -> None:
    d = build_deploy(project, with_env=False)
    _fails(alma("verify", d.dir), ".env.initrd-flash")


def test_truncated_bundle(project: Path, alma) -> None:
    d = build_deploy(project)
    data = d.bundle.read_bytes()
    d.bundle.write_bytes(data[: len(data) // 3])
    _fails(alma("verify", d.dir), "bundle")


def test_failure_leaves_existing_manifest_untouched(project: Path, alma) -> None:
    d = build_deploy(project)
    assert alma("verify", d.dir).code == 0
    path = manifest_path(project, IMAGE, d.machine)
    before = path.read_bytes()
    (d.dir / f"{IMAGE}-{d.machine}.rootfs.manifest").unlink()
    _fails(alma("verify", d.dir), "no image manifest")
    assert path.read_bytes() == before
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_no_deploy_dir_points_at_absent(project: Path, alma) -> None:
    r = alma("verify", "--machine", "jetson-orin-nano-devkit")
    _fails(r, "no deploy dir found", "build/jetson-orin-nano-devkit/tmp-glibc/deploy/images/jetson-orin-nano-devkit")
    assert "--absent" in r.err
    _fails(alma("verify", project / "nowhere"), "deploy dir not found")


def test_absent_records_unknown_not_false(project: Path, alma) -> None:
    r = alma("verify", "--absent")
    assert r.code == 0, r.err
    m = _manifest(project, "jetson-orin-nano-devkit")
    assert m.value("image_buildable") is None  # unknown, never "cannot be built"
    assert m.value("status") is None and m.value("bundle_sha256") is None
    assert "not built/verified here" in m.fact("kernel_version").source


def test_absent_refuses_when_artefacts_exist(project: Path, alma) -> None:
    build_deploy(project)
    before = sorted((project / "facts").glob("*.json")) if (project / "facts").exists() else []
    _fails(alma("verify", "--absent"), "refusing to record that nothing is built")
    assert (sorted((project / "facts").glob("*.json")) if (project / "facts").exists() else []) == before


def test_absent_refuses_even_an_empty_deploy_dir(project: Path, alma) -> None:
    # a deploy dir says a build ran here (bitbake creates it before the image task finishes)
    d = project / "build" / "jetson-orin-nano-devkit" / "tmp-glibc" / "deploy" / "images" / "jetson-orin-nano-devkit"
    d.mkdir(parents=True)
    _fails(alma("verify", "--absent"), "refusing to record that nothing is built")


def test_verify_without_arguments_verifies_every_machine_built(project: Path, alma) -> None:
    build_deploy(project, "jetson-orin-nano-devkit")
    build_deploy(project, "jetson-agx-orin-devkit")
    r = alma("verify")
    assert r.code == 0, r.err
    assert _manifest(project, "jetson-orin-nano-devkit").value("env_machine") == "jetson-orin-nano-devkit"
    assert _manifest(project, "jetson-agx-orin-devkit").value("env_machine") == "jetson-agx-orin-devkit"
    assert not manifest_path(project, IMAGE, "jetson-orin-nano-devkit-nvme").exists()


def test_one_bad_machine_writes_no_manifest(project: Path, alma) -> None:
    build_deploy(project, "jetson-orin-nano-devkit")
    d = build_deploy(project, "jetson-agx-orin-devkit")
    (d.dir / f"{IMAGE}-jetson-agx-orin-devkit.rootfs.manifest").unlink()
    _fails(alma("verify"), "no image manifest")
    assert not manifest_path(project, IMAGE, "jetson-orin-nano-devkit").exists()


def test_hash_cache_hit_and_rehash(project: Path, alma) -> None:
    d = build_deploy(project)
    assert alma("verify", d.dir).code == 0
    real = hashlib.sha256(d.bundle.read_bytes()).hexdigest()
    cache_file = default_cache_file()
    data = json.loads(cache_file.read_text())
    keys = [k for k in data["entries"] if k.startswith("bundle:")]
    assert len(keys) == 1 and str(d.bundle) in keys[0]
    # Plant a different value: a second run that re-read the file could not report it.
    data["entries"][keys[0]]["sha256"] = "0" * 64
    cache_file.write_text(json.dumps(data))
    assert alma("verify", d.dir).code == 0
    m = _manifest(project, d.machine)
    assert m.value("bundle_sha256") == "0" * 64
    assert "cached" in m.fact("bundle_sha256").source
    assert alma("verify", d.dir, "--rehash").code == 0
    assert _manifest(project, d.machine).value("bundle_sha256") == real
    assert "(read)" in _manifest(project, d.machine).fact("bundle_sha256").source


def test_cache_misses_when_the_file_changes(project: Path, alma) -> None:
    d = build_deploy(project)
    assert alma("verify", d.dir).code == 0
    members = [(".env.initrd-flash", b'MACHINE="jetson-orin-nano-devkit"\nROOTFS_IMAGE="alma-image.ext4"\n')]
    members += [(n, b"x") for n in ("initrd-flash", "flash.xml.in", "alma-image.ext4")]
    make_bundle(d.bundle, members)  # same path, new content: size/mtime/inode change
    assert alma("verify", d.dir).code == 0
    assert _manifest(project, d.machine).value("bundle_sha256") == hashlib.sha256(d.bundle.read_bytes()).hexdigest()


def _record(project: Path, sha: str, *, result: str = "SUCCESS", final: str | None = "SUCCESS", boot: bool = False):  # type: ignore[no-untyped-def]
    rec = records.FlashRecord(
        board={"usb_instance": "1-8.4", "vendor": "0955", "product": "7523", "module": "p3767-0005", "soc": "t234"},
        bundle_sha256=sha,
        bundle_path="/x/alma-image-jetson-orin-nano-devkit.rootfs-20261130120000.tegraflash.tar.gz",
        machine="jetson-orin-nano-devkit",
        started="2026-11-30T13:00:00Z" if not boot else "2026-11-30T14:00:00Z",
        finished="2026-11-30T13:20:00Z",
        result=result,
        final_status=final,
        exit_code=0,
        boot=records.Boot(seen=True, console="/dev/ttyACM0", kernel_banner=f"Linux version {KREL}") if boot else None,
        image=IMAGE,
    )
    return records.save(rec, project / "facts" / "flash-records")


def test_status_derived_from_flash_records(project: Path, alma) -> None:
    d = build_deploy(project)
    sha = hashlib.sha256(d.bundle.read_bytes()).hexdigest()
    _record(project, "f" * 64)  # another bundle's success does not count
    _record(project, sha, result="FAILED", final="FAILED")
    assert alma("verify", d.dir).code == 0
    assert _manifest(project, d.machine).value("status") == "Prototype"
    # initrd-flash exits 0 even when the device reports FAILED: exit 0 alone is not Flashed
    _record(project, sha, result="SUCCESS", final="FAILED")
    assert alma("verify", d.dir).code == 0
    assert _manifest(project, d.machine).value("status") == "Prototype"
    _record(project, sha)
    assert alma("verify", d.dir).code == 0
    m = _manifest(project, d.machine)
    assert (m.value("status"), m.value("flashed"), m.value("booted")) == ("Flashed", True, False)
    assert "flash-records" in m.fact("status").source
    _record(project, sha, boot=True)
    assert alma("verify", d.dir).code == 0
    assert _manifest(project, d.machine).value("status") == "Booted"


def test_buildhistory_build_time_when_names_carry_no_stamp(project: Path, alma) -> None:
    d = build_deploy(project)
    # A copied deploy dir: plain files under the link names, no DATETIME anywhere.
    topdir = project / "other-build"
    flat = topdir / "tmp" / "deploy" / "images" / d.machine
    flat.mkdir(parents=True)
    for p in d.dir.iterdir():
        if p.is_symlink() and ".rootfs." in p.name or p.name == f"Image-{d.machine}.bin":
            shutil.copy(p.resolve(), flat / p.name)
    r = alma("verify", flat, "--out", project / "out.json")
    assert r.code == 0, r.err
    assert load_manifest(project / "out.json").value("build_time") is None
    # BUILDHISTORY_DIR_IMAGE = ${TOPDIR}/buildhistory/images/${MACHINE_ARCH}/${TCLIBC}/${IMAGE_BASENAME}
    bh = topdir / "buildhistory" / "images" / "jetson_orin_nano_devkit" / "glibc" / IMAGE
    bh.mkdir(parents=True)
    (bh / "image-info.txt").write_text("DISTRO = alma\nIMAGESIZE = 812345\n")
    os.utime(bh / "image-info.txt", (1764504000, 1764504000))  # 2025-11-30T12:00:00Z
    assert alma("verify", flat, "--out", project / "out.json").code == 0
    m = load_manifest(project / "out.json")
    assert m.value("build_time") == "2025-11-30T12:00:00Z"
    assert "buildhistory" in m.fact("build_time").source


def test_several_images_need_a_choice(project: Path, alma) -> None:
    d = build_deploy(project)
    build_deploy(project, image="alma-image-dev")
    _fails(alma("verify", d.dir), "several images")
    assert alma("verify", d.dir, "--image", "alma-image-dev").code == 0
    assert manifest_path(project, "alma-image-dev", d.machine).is_file()


def test_progress_plain_lines(capsys: pytest.CaptureFixture[str]) -> None:
    from alma.cli.verify import _Progress

    p = _Progress("hashing bundle")
    total = 1600 << 20
    for done in range(0, total + 1, 100 << 20):
        p(done, total)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("hashing bundle: 12%") and err[-1].startswith("hashing bundle: 100%")
    assert 8 <= len(err) <= 11


@pytest.mark.parametrize("cut", [0.5, 0.97])
def test_truncated_late_is_still_caught(project: Path, alma, cut: float) -> None:
    d = build_deploy(project)
    data = d.bundle.read_bytes()
    d.bundle.write_bytes(data[: int(len(data) * cut)])
    _fails(alma("verify", d.dir), "bundle")


def test_corrupt_gzip_data(project: Path, alma) -> None:
    d = build_deploy(project)
    data = bytearray(d.bundle.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: CRC or deflate error, never a silent pass
    d.bundle.write_bytes(bytes(data))
    _fails(alma("verify", d.dir), "bundle")


def test_zip_packaged_bundle(project: Path, alma) -> None:
    import zipfile

    from artefacts.alma_deployfix import env_text

    d = build_deploy(project)
    d.bundle_link.unlink()
    d.bundle.unlink()
    real = d.dir / f"{IMAGE}-{d.machine}.rootfs-20261130120000.tegraflash.zip"
    with zipfile.ZipFile(real, "w") as zf:
        zf.writestr(".env.initrd-flash", env_text(d.machine, IMAGE))
        for n in ("initrd-flash", "flash.xml.in", f"{IMAGE}.ext4"):
            zf.writestr(n, b"x" * 100)
    (d.dir / f"{IMAGE}-{d.machine}.rootfs.tegraflash.zip").symlink_to(real.name)
    # judged as alma flash judges it: built and hashed, but not a bundle alma flash can flash
    r = alma("verify", d.dir)
    assert r.code != 0 and "a zip bundle" in r.err and "flashable" not in r.err, r.err
    from alma.tegraflash.unpack import unpack

    with pytest.raises(UserError) as by_flash:
        unpack(real, project / "work", None)
    assert "a zip bundle" in by_flash.value.message
    assert hashlib.sha256(real.read_bytes()).hexdigest() not in r.out  # no manifest names it flashable
