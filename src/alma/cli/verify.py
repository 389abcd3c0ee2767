"""``alma verify``: read build artefacts on disk and write the facts manifest."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from alma.cli.output import emit_json, is_tty


class _Progress:
    """A rich bar on a terminal; otherwise a plain line every 10 % on stderr."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.bar: Any = None
        self.task: Any = None
        self.next_pct = 10
        self.t0 = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        if sys.stderr.isatty():
            if self.bar is None:
                from rich.progress import (
                    BarColumn,
                    DownloadColumn,
                    Progress,
                    TextColumn,
                    TimeRemainingColumn,
                    TransferSpeedColumn,
                )

                self.bar = Progress(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    DownloadColumn(),
                    TransferSpeedColumn(),
                    TimeRemainingColumn(),
                    transient=True,
                )
                self.bar.start()
                self.task = self.bar.add_task(self.label, total=total)
            self.bar.update(self.task, completed=done)
            return
        if total >= 64 << 20 and done * 100 >= self.next_pct * total:
            pct = done * 100 // total
            click.echo(f"{self.label}: {pct}% ({done >> 20} / {total >> 20} MiB)", err=True)
            self.next_pct = pct // 10 * 10 + 10

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


@click.command(
    epilog="Exit codes: 0 manifest(s) written; 2 missing or inconsistent artefacts (every problem is "
    "listed, nothing is written), no deploy dir, --absent while a deploy dir exists, an unwritable "
    "--out, or a bad option; 70 internal error; 130 interrupted.",
)
@click.argument("deploy_dir", required=False, type=click.Path(path_type=Path))
@click.option(
    "--machine",
    "-m",
    help="MACHINE (default: the deploy dir's name; with no DEPLOY_DIR, every machine `alma build` built).",
)
@click.option("--image", "-i", help="Image recipe (default: the only image with a bundle in the deploy dir).")
@click.option("--rehash", is_flag=True, help="Ignore the hash cache and read the bundle again.")
@click.option(
    "--absent",
    is_flag=True,
    help="Record that nothing is built/verified on this machine (all facts null); refused when a deploy dir exists.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the manifest(s) as JSON on stdout.")
@click.option(
    "--sbom",
    "sbom",
    is_flag=True,
    help="Print the supply-chain summary (SBOM packages and licences, CVEs by status x severity, "
    "blind spots, Ignored without detail, NVD date) instead of every fact; --json has all of it.",
)
@click.option(
    "--out", type=click.Path(path_type=Path), help="Write the manifest here instead of facts/<image>-<machine>.json."
)
@click.option(
    "--vex",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write the image's CVE findings as a VEX document here (CycloneDX 1.6 JSON: each CVE with its "
    "CVSS rating and analysis: Patched resolved, Ignored not_affected with the waiver's reason, Unpatched "
    "exploitable). Needs cve-check's report (--feature security).",
)
@click.option("--root", type=click.Path(path_type=Path, file_okay=False), help="Project root (default: this checkout).")
@click.option(
    "--build-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The build tree `alma build --build-dir` used. Default: <root>/build.",
)
def verify(
    deploy_dir: Path | None,
    machine: str | None,
    image: str | None,
    rehash: bool,
    absent: bool,
    as_json: bool,
    sbom: bool,
    out: Path | None,
    vex: Path | None,
    root: Path | None,
    build_dir: Path | None,
) -> None:
    """Read the artefacts of a meta-tegra build (DEPLOY_DIR_IMAGE, by default where `alma build`
    put it: build/<MACHINE>/tmp-glibc/deploy/images/<MACHINE>) and write the facts manifest
    facts/<image>-<machine>.json, each fact with its source. With no DEPLOY_DIR and no
    --machine, every machine the build tree holds is verified.

    Facts: kernel version (from the kernel image's banner), kernel/bundle/rootfs sizes, the
    bundle's sha256 (cached by path, size, mtime and inode; --rehash reads again), build
    time, MACHINE/CHIPID/ROOTFS_DEVICE/BOOTDEV from the bundle's .env.initrd-flash, package
    count and ALMA components from the image manifest, and the status label derived from
    facts/flash-records (Prototype, Flashed, Booted).
    """
    from alma import settings
    from alma.artefacts import verify as v
    from alma.artefacts.manifest import Manifest, manifest_path
    from alma.buildtree import DEFAULT_IMAGE, DEFAULT_MACHINE, build_tree
    from alma.errors import UserError
    from alma.ground import write_atomic

    root = (root or settings.repo_root()).resolve()
    import os

    tree = build_tree(root, build_dir, os.environ)  # exported KAS_BUILD_DIR/DL_DIR, as alma build
    manifests: list[Manifest] = []
    chains: list[Any] = []
    if absent:
        mach = machine or (deploy_dir.name if deploy_dir else DEFAULT_MACHINE)
        searched = [deploy_dir] if deploy_dir else tree.deploy_dirs(mach)
        manifests.append(v.absent(root, mach, image or DEFAULT_IMAGE, searched))
    else:
        todo = v.targets(deploy_dir, machine, tree)
        if vex is not None and len(todo) > 1:
            raise UserError(
                f"--vex names one file, but the build tree holds {len(todo)} machines: "
                + ", ".join(m for _, m in todo),
                hint=f"alma verify --machine {todo[0][1]} --vex {vex}",
            )
        if out is not None and len(todo) > 1:
            raise UserError(
                f"--out names one file, but the build tree holds {len(todo)} machines: "
                + ", ".join(m for _, m in todo),
                hint=f"alma verify --machine {todo[0][1]} --out {out}",
            )
        for deploy, mach in todo:  # every manifest is read before any is written
            prog = _Progress(f"hashing bundle ({mach})")
            try:
                manifests.append(
                    v.verify(deploy, root=root, machine=mach, image=image, rehash=rehash, progress=prog,
                             on_supply_chain=chains.append)
                )  # fmt: skip
            finally:
                prog.close()
    if vex is not None:
        _write_vex(vex, manifests, chains)
    written = []
    for manifest in manifests:
        target = out or manifest_path(root, manifest.image, manifest.machine)
        try:
            write_atomic(target, manifest.to_json())
            target.chmod(0o644)  # a committed file, readable like any other
        except OSError as exc:  # an unwritable --out (or facts/) is the user's to fix, not a crash
            raise UserError(
                f"cannot write the manifest {target}: {exc.strerror or exc}",
                hint="choose a writable place: alma verify --out /a/writable/dir/facts.json"
                if out is not None
                else f"make {target.parent} writable by you",
            ) from None
        written.append(target)
    if as_json:
        docs = [json.loads(m.to_json()) for m in manifests]
        emit_json(docs[0] if len(docs) == 1 else docs)
        return
    if sbom:
        for manifest in manifests:
            for line in _sbom_summary(manifest):
                click.echo(line)
        return
    for manifest, target in zip(manifests, written, strict=True):
        width = max(len(k) for k in manifest.facts)
        if len(manifests) > 1:
            click.echo(f"# {manifest.image} for {manifest.machine}")
        for name in sorted(manifest.facts):
            f = manifest.facts[name]
            val = json.dumps(f.value) if not isinstance(f.value, str) else f.value
            click.echo(f"{name:<{width}}  {val}" + (f"    [{f.source}]" if is_tty() else ""))
        click.echo(f"wrote {target}", err=True)


def _write_vex(path: Path, manifests: list[Any], chains: list[Any]) -> None:
    from alma.artefacts.vex import vex_json
    from alma.errors import UserError
    from alma.ground import write_atomic

    report = chains[0].cve if chains else None
    if not manifests or report is None:
        raise UserError(
            "--vex: no cve-check report for this image, so no VEX document (nothing is written)",
            hint="build with the security feature: alma build --feature security, then alma verify --vex FILE",
        )
    m = manifests[0]
    try:
        write_atomic(path, vex_json(report, m.image, m.machine))
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}", hint="choose a writable --vex path") from None


def _sbom_summary(m: Any) -> list[str]:
    v = m.value
    lines = [f"# supply chain of {m.image} for {m.machine}"]
    if v("sbom_format") is None:
        lines.append("SBOM: none in the deploy dir (create-spdx is inherited by default: was it removed?)")
    else:
        lines.append(f"SBOM: {v('sbom_format')}, {v('sbom_package_count')} packages")
        for lic, n in sorted(v("licences").items(), key=lambda kv: (-kv[1], kv[0]))[:15]:
            lines.append(f"  {n:5d}  {lic}")
        prop, unknown = v("licence_proprietary"), v("licence_unknown")
        lines.append(f"  Proprietary: {len(prop)} {' '.join(prop[:10])}".rstrip())
        lines.append(f"  unknown licence: {len(unknown)} {' '.join(unknown[:10])}".rstrip())
    if v("cve_counts") is None:
        lines.append("CVEs: no cve-check JSON (build with --feature security)")
    else:
        counts = v("cve_counts")
        lines.append(
            f"CVEs: {v('cve_package_count')} packages checked (NVD data of {v('nvd_data_date') or 'unknown date'})"
        )
        lines.append("  status     " + " ".join(f"{s:>8}" for s in ("critical", "high", "medium", "low", "none")))
        for status, row in counts.items():
            lines.append(
                f"  {status:<10} " + " ".join(f"{row[s]:>8}" for s in ("critical", "high", "medium", "low", "none"))
            )
        blind, worst = v("cve_blind_spots"), v("cve_blind_spots_critical")
        lines.append(
            f"  blind spots (NVD knows no product): {len(blind)}; "
            f"Proprietary or boot chain: {' '.join(worst) or 'none'}"
        )
        unpatched = v("cve_unpatched") or []
        lines.append(f"  Unpatched ({len(unpatched)}; critical or v2-only high: {v('cve_unpatched_critical')}):")
        lines += [f"    {u}" for u in unpatched]
        ignored, bare = v("cve_ignored") or [], v("cve_ignored_without_detail")
        lines.append(f"  Ignored ({len(ignored)}), each with its status key and reason:")
        for i in ignored:
            why = f": {i.get('reason')}" if i.get("reason") else " (no reason given)"
            lines.append(f"    {i['package']} {i['id']} {i.get('detail') or '(no status key)'}{why}")
        lines.append(f"  Ignored without a reason (a finding): {len(bare)} {' '.join(bare[:10])}".rstrip())
    return lines
