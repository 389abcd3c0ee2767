"""`alma verify` reads the bundle through the same checks as `alma flash`: a hostile bundle
(the CVE-2025-4517 write-through-a-link chain) that verify used to accept (exit 0, a facts
manifest naming its sha256 for flash to trust) is refused, and a cached scan from an older
reader is not trusted."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

from artefacts.alma_deployfix import build_deploy, env_text

from alma.artefacts.bundle import scan_bundle


def _hostile_bundle(path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:

        def add(ti: tarfile.TarInfo, data: bytes | None = None) -> None:
            if data is not None:
                ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data) if data is not None else None)

        add(tarfile.TarInfo(".env.initrd-flash"), env_text("jetson-orin-nano-devkit", "alma-image").encode())
        for n in ("initrd-flash", "flash.xml.in", "alma-image.ext4"):
            add(tarfile.TarInfo(n), b"x")
        d = tarfile.TarInfo("d")
        d.type = tarfile.DIRTYPE
        add(d)
        a = tarfile.TarInfo("a")
        a.type, a.linkname = tarfile.SYMTYPE, "d"
        add(a)
        out = tarfile.TarInfo("a/l")
        out.type, out.linkname = tarfile.SYMTYPE, "../../../../etc"
        add(out)
        add(tarfile.TarInfo("a/l/alma-pwned"), b"owned")
    path.write_bytes(gzip.compress(buf.getvalue()))


def test_verify_refuses_a_bundle_flash_would_refuse(project: Path, alma) -> None:  # type: ignore[no-untyped-def]
    d = build_deploy(project)
    _hostile_bundle(d.bundle)
    r = alma("verify", d.dir)
    assert r.code == 2, (r.out, r.err)
    assert "unsafe bundle" in r.err and "lies under 'a'" in r.err and "try:" in r.err
    assert not list((project / "facts").glob("*.json"))  # no manifest that flash would trust


def test_a_cached_scan_from_an_older_reader_is_not_trusted(project: Path, alma) -> None:  # type: ignore[no-untyped-def]
    from alma.artefacts.cache import Cache, file_key

    d = build_deploy(project)
    _hostile_bundle(d.bundle)
    cache = Cache()
    old = {
        "sha256": "0" * 64,
        "size": d.bundle.stat().st_size,
        "env": {"MACHINE": d.machine},
        "complete": True,
        "members": [".env.initrd-flash", "alma-image.ext4", "flash.xml.in", "initrd-flash"],
    }
    cache.put(file_key(d.bundle.resolve(), "bundle"), old)  # what the old reader stored: no "reader"
    cache.save()
    r = alma("verify", d.dir)
    assert r.code == 2 and "unsafe bundle" in r.err


def test_scan_and_flash_share_the_env_parser(tmp_path: Path) -> None:
    b = tmp_path / "b.tegraflash.tar.gz"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        text = b'MACHINE="m"\nDEFAULTS[BOARDID]="3767"\n'
        ti = tarfile.TarInfo(".env.initrd-flash")
        ti.size = len(text)
        tar.addfile(ti, io.BytesIO(text))
    b.write_bytes(buf.getvalue())
    scan = scan_bundle(b)
    assert scan.env == {"MACHINE": "m", "DEFAULTS[BOARDID]": "3767"}
