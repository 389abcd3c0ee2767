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
    epilog="Exit codes: 0 manifest written; 2 missing or inconsistent artefacts (every problem is "
    "listed, nothing is written), no deploy dir, or a bad option; 130 interrupted.",
)
@click.argument("deploy_dir", required=False, type=click.Path(path_type=Path))
@click.option("--machine", "-m", help="MACHINE (default: the deploy dir's name, else jetson-orin-nano-devkit).")
@click.option("--image", "-i", help="Image recipe (default: the only image with a bundle in the deploy dir).")
@click.option("--rehash", is_flag=True, help="Ignore the hash cache and read the bundle again.")
@click.option("--absent", is_flag=True, help="Record that nothing is built/verified on this machine (all facts null).")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON on stdout.")
@click.option(
    "--out", type=click.Path(path_type=Path), help="Write the manifest here instead of facts/<image>-<machine>.json."
)
@click.option("--root", type=click.Path(path_type=Path, file_okay=False), help="Project root (default: this checkout).")
def verify(
    deploy_dir: Path | None,
    machine: str | None,
    image: str | None,
    rehash: bool,
    absent: bool,
    as_json: bool,
    out: Path | None,
    root: Path | None,
) -> None:
    """Read the artefacts of a meta-tegra build (DEPLOY_DIR = tmp/deploy/images/<MACHINE>) and
    write the facts manifest facts/<image>-<machine>.json, each fact with its source.

    Facts: kernel version (from the kernel image's banner), kernel/bundle/rootfs sizes, the
    bundle's sha256 (cached by path, size, mtime and inode; --rehash reads again), build
    time, MACHINE/CHIPID/ROOTFS_DEVICE/BOOTDEV from the bundle's .env.initrd-flash, package
    count and ALMA components from the image manifest, and the status label derived from
    facts/flash-records (Prototype, Flashed, Booted).
    """
    from alma import settings
    from alma.artefacts import verify as v
    from alma.artefacts.deploy import default_deploy_dirs
    from alma.artefacts.manifest import manifest_path
    from alma.ground import write_atomic

    root = (root or settings.repo_root()).resolve()
    if absent:
        mach = machine or (deploy_dir.name if deploy_dir else v.DEFAULT_MACHINE)
        searched = [deploy_dir] if deploy_dir else default_deploy_dirs(root, mach)
        manifest = v.absent(root, mach, image or v.DEFAULT_IMAGE, searched)
    else:
        prog = _Progress("hashing bundle")
        try:
            manifest = v.verify(deploy_dir, root=root, machine=machine, image=image, rehash=rehash, progress=prog)
        finally:
            prog.close()
    target = out or manifest_path(root, manifest.image, manifest.machine)
    write_atomic(target, manifest.to_json())
    target.chmod(0o644)  # a committed file, readable like any other
    if as_json:
        emit_json(json.loads(manifest.to_json()))
        return
    width = max(len(k) for k in manifest.facts)
    for name in sorted(manifest.facts):
        f = manifest.facts[name]
        val = json.dumps(f.value) if not isinstance(f.value, str) else f.value
        click.echo(f"{name:<{width}}  {val}" + (f"    [{f.source}]" if is_tty() else ""))
    click.echo(f"wrote {target}", err=True)
