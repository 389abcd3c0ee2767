"""``alma verify``: read facts from build artefacts on disk into a facts manifest.

Every fact carries its source. Missing or inconsistent artefacts are collected and raised
together as one error (exit 2): nothing is silently skipped and no manifest is written
from a half-read deploy dir. ``absent()`` is the one honest way to record that nothing
has been built/verified on this machine: every artefact fact is null, with the searched
places as its source.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alma.artefacts import deploy as dp
from alma.artefacts.bundle import ENV_MEMBER, REQUIRED_MEMBERS, BundleScan, Progress, scan_bundle
from alma.artefacts.cache import Cache, file_key
from alma.artefacts.kernel import KernelFacts, read_kernel
from alma.artefacts.manifest import FACT_KINDS, STATUS_FACTS, Manifest
from alma.artefacts.rootfs import COMPONENTS, legitimize, read_rootfs_manifest
from alma.artefacts.status import derive_status
from alma.buildtree import DEFAULT_MACHINE, BuildTree, build_tree, recorded_env
from alma.errors import UserError
from alma.ground import utc_iso
from alma.tegraflash.names import ZIP_HINT, ZIP_REFUSAL, is_zip

log = logging.getLogger("alma.verify")

# Every fact `alma verify` writes: a manifest always carries all of them (null = unknown).
ARTEFACT_FACTS = tuple(name for name in FACT_KINDS if name not in STATUS_FACTS)


class ArtefactError(UserError):
    """Artefacts are missing or contradict each other; lists every problem found."""

    def __init__(self, deploy: Path, problems: list[str], hint: str | None = None) -> None:
        super().__init__(
            f"{deploy}: {len(problems)} artefact problem(s):\n  " + "\n  ".join(problems),
            hint=hint or "rebuild the image (alma build) or point alma verify at the right deploy dir",
        )
        self.problems = problems


def _cached_bundle(path: Path, cache: Cache, rehash: bool, progress: Progress | None) -> tuple[BundleScan, bool]:
    key = file_key(path, "bundle")
    hit = None if rehash else cache.get(key)
    if hit is not None:
        try:
            return BundleScan.from_dict(hit), True
        except (KeyError, TypeError, ValueError):
            pass
    scan = scan_bundle(path, progress)
    cache.put(key, scan.to_dict())
    return scan, False


def _cached_kernel(path: Path, cache: Cache, rehash: bool) -> KernelFacts:
    key = file_key(path, "kernel")
    hit = None if rehash else cache.get(key)
    if hit is not None:
        try:
            return KernelFacts(**hit)
        except TypeError:
            pass
    kf = read_kernel(path)
    cache.put(key, kf.__dict__.copy())
    return kf


def resolve_deploy(deploy: Path | None, machine: str | None, tree: BuildTree) -> tuple[Path, str]:
    if deploy is not None:
        deploy = Path(deploy)
        if not deploy.is_dir():
            raise UserError(
                f"deploy dir not found: {deploy}",
                hint="pass tmp/deploy/images/<MACHINE> of a finished build, or record that nothing "
                "is built here: alma verify --absent",
            )
        return deploy, machine or deploy.resolve().name
    machine = machine or DEFAULT_MACHINE
    found = tree.deploy_dir(machine)
    if found is not None:
        return found, machine
    raise NoDeployDir(tree, machine)


class NoDeployDir(UserError):
    def __init__(self, tree: BuildTree, machine: str | None) -> None:
        where = tree.deploy_dirs(machine) if machine else [tree.work_dir / "<machine>" / "tmp-glibc/deploy/images"]
        built = ", ".join(tree.built()) or "none"
        super().__init__(
            "no deploy dir found (looked in: " + ", ".join(str(c) for c in where) + f"; machines built here: {built})",
            hint="build first (alma build --machine MACHINE), pass the deploy dir (alma verify PATH), or record "
            "honestly that nothing is built on this machine: alma verify --absent",
        )


def targets(deploy: Path | None, machine: str | None, tree: BuildTree) -> list[tuple[Path, str]]:
    """(deploy dir, machine) pairs to verify: the one given, or every machine the build tree holds."""
    if deploy is not None or machine is not None:
        return [resolve_deploy(deploy, machine, tree)]
    built = tree.built()
    if not built:
        raise NoDeployDir(tree, DEFAULT_MACHINE)
    return [(d, m) for m, d in built.items()]


@dataclass
class _Collect:
    """What every fact collector reads and writes: one deploy dir, one image, one manifest."""

    m: Manifest
    deploy: Path
    image: str
    machine: str
    tree: BuildTree
    cache: Cache
    rehash: bool
    progress: Progress | None
    on_cache: Callable[[str, bool], None] | None
    problems: list[str] = field(default_factory=list)
    kernel_pkg: tuple[str, str] | None = None  # (legitimized release, package) from the image manifest
    stamp: str | None = None  # the bundle's IMAGE_NAME DATETIME: the supply-chain files must carry it
    on_supply_chain: Callable[[Any], None] | None = None  # gets the SupplyChain read (alma verify --vex)
    root: Path | None = None  # the project: its [ota] signing_cert verifies the .swu

    @property
    def link(self) -> str:
        return dp.link_name(self.image, self.machine)

    def dangling(self, link: Path) -> None:
        self.problems.append(f"dangling symlink: {link.name} -> {os.readlink(link)} (target missing)")

    def present(self, found: dp.Located | None, missing: str) -> dp.Located | None:
        """``found`` if it is there; else the problem: ``missing``, or its dangling link."""
        if found is None:
            self.problems.append(missing)
        elif found.dangling:
            self.dangling(found.link)
        else:
            return found
        return None


def verify(
    deploy: Path | None,
    *,
    root: Path,
    machine: str | None = None,
    image: str | None = None,
    rehash: bool = False,
    cache: Cache | None = None,
    progress: Progress | None = None,
    on_cache: Callable[[str, bool], None] | None = None,
    tree: BuildTree | None = None,
    on_supply_chain: Callable[[Any], None] | None = None,
) -> Manifest:
    tree = tree or build_tree(root)
    deploy, machine = resolve_deploy(deploy, machine, tree)
    image = image or _only_image(deploy, machine)
    m = Manifest(machine=machine, image=image, generated=utc_iso())
    ctx = _Collect(m, deploy, image, machine, tree, cache or Cache(), rehash, progress, on_cache)
    ctx.on_supply_chain = on_supply_chain
    ctx.root = root
    for collect in COLLECTORS:
        collect(ctx)
    ctx.cache.save()
    if ctx.problems:
        raise ArtefactError(deploy, ctx.problems)
    host = socket.gethostname()
    for name in ARTEFACT_FACTS:
        if name not in m.facts:
            m.set(name, None, f"{deploy}: not found on host {host}")
    derive_status(m, root / "facts")
    return m


def _only_image(deploy: Path, machine: str) -> str:
    """The one image whose bundle is in ``deploy`` (none or several: the user must say)."""
    images = dp.images_in(deploy, machine)
    if not images:
        stamped = sorted(deploy.glob(f"*-{machine}.rootfs-*.tegraflash.*"))
        extra = f" (timestamped files exist: {', '.join(p.name for p in stamped[:3])})" if stamped else ""
        raise ArtefactError(
            deploy,
            [f"no bundle: no *-{machine}.rootfs.tegraflash.tar.gz here{extra}"],
            hint=f"check MACHINE (the dir is for {deploy.name!r}), or build: alma build",
        )
    if len(images) > 1:
        raise UserError(
            f"{deploy}: bundles for several images: {', '.join(images)}",
            hint="choose one: alma verify --image " + images[0],
        )
    return images[0]


def _bundle_facts(c: _Collect) -> None:
    """The flashable bundle: the fingerprint of the build, and its .env.initrd-flash."""
    m, image, machine = c.m, c.image, c.machine
    found = dp.find_bundle(c.deploy, image, machine)
    stamped = dp.stamped_siblings(c.deploy, image, machine) if found is None else []
    note = f"; timestamped files without a link: {', '.join(p.name for p in stamped)}" if stamped else ""
    b = c.present(found, f"no bundle: {c.link}.tegraflash.tar.gz is missing{note}")
    if b is None:
        return
    assert b.real is not None
    scan, hit = _cached_bundle(b.real, c.cache, c.rehash, c.progress)
    if c.on_cache:
        c.on_cache(str(b.real), hit)
    src = str(b.real)
    if is_zip(b.real.name):  # judged as alma flash judges it: built, not flashable
        m.set("image_buildable", True, f"{src}: a bundle exists, so the image was built")
        c.problems.append(f"{b.real.name}: {ZIP_REFUSAL} (try: {ZIP_HINT})")
    else:
        m.set("image_buildable", True, f"{src}: a flashable bundle exists, so the image was built")
    m.set("bundle_path", src, f"{b.link} -> {b.real.name}" if b.link != b.real else src)
    m.set("bundle_bytes", scan.size, f"{src}: file size")
    m.set("bundle_sha256", scan.sha256, f"{src}: sha256 ({'cached by path/size/mtime/inode' if hit else 'read'})")
    stamp = dp.stamp_time(b.real.name)
    if stamp:
        m.set("build_time", stamp, f"{b.real.name}: IMAGE_NAME DATETIME stamp (UTC)")
        found = dp.STAMP.search(b.real.name)
        c.stamp = found.group(1) if found else None
    _bundle_env_facts(c, scan, b.real)


def _bundle_env_facts(c: _Collect, scan: BundleScan, real: Path) -> None:
    esrc = f"{real}:{ENV_MEMBER}"
    if scan.env is None:
        c.problems.append(f"{real.name}: bundle has no {ENV_MEMBER} (built without initrd-flash support?)")
        return
    env = scan.env
    c.m.set("env_machine", env.get("MACHINE"), esrc)
    c.m.set("env_chipid", env.get("CHIPID"), esrc)
    c.m.set("env_rootfs_device", env.get("ROOTFS_DEVICE"), esrc)
    c.m.set("env_bootdev", env.get("BOOTDEV"), esrc)
    if env.get("MACHINE") != c.machine:
        c.problems.append(
            f"wrong machine: {real.name}: {ENV_MEMBER} says MACHINE={env.get('MACHINE')!r}, "
            f"this deploy dir/--machine is {c.machine!r}"
        )
    rootfs_member = env.get("ROOTFS_IMAGE")
    wanted = [*REQUIRED_MEMBERS, *([rootfs_member] if rootfs_member else [])]
    missing = [n for n in wanted if n not in scan.members]
    if missing:
        c.problems.append(f"{real.name}: bundle lacks {', '.join(missing)}")
    if rootfs_member and not rootfs_member.startswith(c.image + "."):
        c.problems.append(f"{real.name}: {ENV_MEMBER} ROOTFS_IMAGE={rootfs_member!r} is not image {c.image!r}")


def _rootfs_facts(c: _Collect) -> None:
    r = c.present(dp.locate(c.deploy / (c.link + ".ext4")), f"no rootfs: {c.link}.ext4 is missing")
    if r is not None:
        c.m.set("rootfs_bytes", r.path.stat().st_size, f"{r.path}: file size")
        c.m.set("rootfs_path", str(r.path), f"{r.link}")


def _image_manifest_facts(c: _Collect) -> None:
    """The image manifest: packages, components, the kernel package (for the kernel check)."""
    m = c.m
    mf = c.present(dp.locate(c.deploy / (c.link + ".manifest")), f"no image manifest: {c.link}.manifest is missing")
    if mf is None:
        return
    try:
        rm = read_rootfs_manifest(mf.path)
    except UserError as exc:
        c.problems.append(exc.message)
        return
    m.set("package_count", rm.count, f"{mf.path}: lines")
    m.set("components", rm.components(), f"{mf.path}: packages {', '.join(COMPONENTS)}")
    c.kernel_pkg = rm.kernel_release()
    if c.kernel_pkg:
        arch, ver = rm.packages[c.kernel_pkg[1]]
        m.set("kernel_package", f"{c.kernel_pkg[1]} {ver}", f"{mf.path}: kernel package")
    else:
        m.set("kernel_package", None, f"{mf.path}: no kernel-<release> package in the image")
    if not stamp_set(m):
        t = dp.stamp_time(mf.path.name)
        if t:
            m.set("build_time", t, f"{mf.path.name}: IMAGE_NAME DATETIME stamp (UTC)")


def _kernel_facts(c: _Collect) -> None:
    """The kernel, from the image itself; it must be the release the image manifest installs."""
    names = ", ".join(n.format(machine=c.machine) for n in dp.KERNEL_NAMES)
    k = c.present(dp.find_kernel(c.deploy, c.machine), f"no kernel image: none of {names}")
    if k is None:
        return
    try:
        kf = _cached_kernel(k.path, c.cache, c.rehash)
    except UserError as exc:
        c.problems.append(exc.message)
        return
    ksrc = f"{k.path}: 'Linux version' banner" + (" (gzip)" if kf.compressed else "")
    c.m.set("kernel_version", kf.release, ksrc)
    c.m.set("kernel_banner", kf.banner, ksrc)
    c.m.set("kernel_image_bytes", k.path.stat().st_size, f"{k.path}: file size")
    c.m.set("kernel_image_path", str(k.path), str(k.link))
    if c.kernel_pkg and legitimize(kf.release) != c.kernel_pkg[0]:
        c.problems.append(
            f"kernel mismatch: the image manifest has {c.kernel_pkg[1]} but {k.path.name} says "
            f"'Linux version {kf.release}' (stale kernel image or manifest from another build)"
        )


def _supply_chain_facts(c: _Collect) -> None:
    """SPDX SBOM and cve-check output (alma.artefacts.sbom)."""
    from alma.artefacts.sbom import read_supply_chain

    downloads = c.tree.downloads
    recorded = recorded_env(c.deploy, c.tree, c.machine)
    if recorded is not None and c.tree.source("DL_DIR") == "default" and recorded[0].get("DL_DIR"):
        downloads = Path(recorded[0]["DL_DIR"])  # where the build that made this deploy dir had it
    try:
        chain = read_supply_chain(c.deploy, c.link, downloads, c.stamp)
    except UserError as exc:
        c.problems.append(exc.message)
    else:
        for name, (value, source) in chain.facts().items():
            c.m.set(name, value, source)
        if c.on_supply_chain is not None:
            c.on_supply_chain(chain)


def _build_time_fallback(c: _Collect) -> None:
    """No DATETIME stamp in any artefact name: buildhistory's files, else unknown."""
    if stamp_set(c.m):
        return
    bh = dp.buildhistory_dir(c.deploy, c.image, c.machine)
    for name in ("image-info.txt", "build-id.txt"):
        f = bh / name
        if f.is_file():
            c.m.set("build_time", utc_iso(f.stat().st_mtime), f"{f}: mtime (buildhistory)")
            return
    c.m.set("build_time", None, "no DATETIME stamp in the artefact names and no buildhistory")


def _update_facts(c: _Collect) -> None:
    assert c.root is not None
    _swu_facts(c.m, c.deploy, c.machine, c.problems, c.root)


# One collector per source, in order (the kernel check reads what the image manifest found;
# the build time falls back to buildhistory only when no artefact name carried a stamp).
COLLECTORS: tuple[Callable[[_Collect], None], ...] = (
    _bundle_facts,
    _rootfs_facts,
    _image_manifest_facts,
    _kernel_facts,
    _update_facts,
    _supply_chain_facts,
    _build_time_fallback,
)


def _swu_facts(m: Manifest, deploy: Path, machine: str, problems: list[str], root: Path) -> None:
    """Facts from ``*-<machine>.swu`` (the link name, not the stamped files), when there is one."""
    from alma.update.swu import SwuError, read_swu

    links = sorted(p for p in deploy.glob(f"*-{machine}.swu") if p.is_file())
    if not links:
        return
    if len(links) > 1:
        problems.append(f"several update artefacts: {', '.join(p.name for p in links)}")
        return
    path = links[0]
    from alma.imagebuild.ota import configured_cert
    from alma.settings import config

    try:
        cert = configured_cert(root, config(root))
    except UserError:
        cert = None
    try:
        info = read_swu(path, cert=cert if cert is not None and cert.is_file() else None)
    except SwuError as exc:
        problems.append(exc.message)
        return
    src = f"{path}: sw-description (payload hashes recomputed)"
    m.set("swu_path", str(path), str(path))
    m.set("swu_sha256", info.sha256, f"{path}: sha256")
    m.set("swu_version", info.version, src)
    # "signed" only for a signature verified against the fleet certificate ([ota] signing_cert):
    # certificates merely carried in sw-description.sig prove nothing (a certs-only bag, or an
    # attacker's signature with the fleet certificate added, carry them too)
    how = (f"{path}: CMS signature over sw-description verified against {cert}" if info.verified is not None
           else f"{path}: not checked: no [ota] signing_cert in alma.toml to verify against")  # fmt: skip
    m.set("swu_signed", info.verified, how)
    m.set("swu_signers", [s["subject"] for s in info.signers], how)
    m.set("swu_signer_sha256", [s["sha256"] for s in info.signers], how)
    if info.signed and info.verified is False:
        problems.append(f"{path.name}: sw-description.sig is not a signature by the fleet certificate {cert}")
    m.set("swu_payloads", {p.filename: p.sha256 for p in info.payloads}, src)
    m.set("swu_capsule_version", info.capsule.version if info.capsule else None, src)
    if info.machine != machine:
        problems.append(f"wrong machine: {path.name} is for {info.machine!r}, this deploy dir is {machine!r}")


def stamp_set(m: Manifest) -> bool:
    return m.has("build_time") and m.facts["build_time"].value is not None


def absent(root: Path, machine: str, image: str, searched: list[Path]) -> Manifest:
    """The honest manifest for 'nothing built/verified here'. Refuses when a deploy dir exists:
    even an empty one says a build ran here, and its manifest is not "nothing built"."""
    for d in searched:
        if d.is_dir():
            raise UserError(
                f"{d} exists: refusing to record that nothing is built for {machine}",
                hint=f"verify it instead: alma verify {d}",
            )
    host = socket.gethostname()
    m = Manifest(machine=machine, image=image, generated=utc_iso())
    where = ", ".join(_rel(d, root) for d in searched) or "(no place given)"
    src = f"alma verify --absent on {host}: no deploy dir found ({where}); not built/verified here"
    for name in ARTEFACT_FACTS:
        m.set(name, None, src)
    derive_status(m, root / "facts")
    return m


def _rel(p: Path, root: Path) -> str:
    try:
        return str(p.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(p)
