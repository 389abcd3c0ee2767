"""Helpers for the flashing station's tests (tests/flash/): real tar.gz bundles made with GNU tar
--sparse (as meta-tegra makes them) around an initrd-flash simulator, facts manifests, and
`alma` run under umockdev so the real libudev sees recorded USB devices."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from artefacts.alma_deployfix import env_text
from support import REPO, require_tool

from alma.artefacts.manifest import Manifest, manifest_path

HERE = Path(__file__).resolve().parent / "flash"
DEVICES = HERE / "devices"
SIMULATOR = HERE / "sim" / "initrd-flash"
IMAGE = "alma-image"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def make_bundle_tree(
    tree: Path,
    *,
    machine: str = "jetson-orin-nano-devkit",
    outcomes: dict[str, str] | None = None,
    external: bool = False,
) -> Path:
    tree.mkdir(parents=True)
    (tree / ".env.initrd-flash").write_text(env_text(machine, IMAGE, external=external))
    shutil.copy2(SIMULATOR, tree / "initrd-flash")
    os.chmod(tree / "initrd-flash", 0o755)
    lines = [f"{k} {v}" for k, v in (outcomes or {"*": "success"}).items()]
    (tree / "sim-outcomes").write_text("\n".join(lines) + "\n")
    (tree / "flash.xml.in").write_text('<?xml version="1.0"?>\n<partition_layout version="01.00.0000"/>\n')
    (tree / "boot.img").write_bytes(os.urandom(64 * 1024))
    # The rootfs image is mostly holes, like a real ext4 image: tar --sparse keeps it small.
    img = tree / f"{IMAGE}.ext4"
    with open(img, "wb") as fh:
        fh.truncate(16 << 20)
        fh.seek(1024)
        fh.write(b"\x53\xef" + os.urandom(4094))  # ext4 magic-ish superblock area
        fh.seek(8 << 20)
        fh.write(os.urandom(64 * 1024))
    (tree / "bootloader").mkdir()
    (tree / "bootloader" / "mb1_t234_prod.bin").write_bytes(os.urandom(4096))
    return tree


def tar_gz(tree: Path, out: Path, *extra: str) -> Path:
    subprocess.run(["tar", "--sparse", *extra, "-czf", str(out), "-C", str(tree), "."], check=True)
    return out


class Station:
    """A flashing station in a temp dir: repo root with facts/, work dir (the board lock is
    the board's own device node inside umockdev's testbed: no lock dir)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.root = base / "repo"
        (self.root / "facts").mkdir(parents=True)
        self.work = base / "work"
        self.records = self.root / "facts" / "flash-records"

    def bundle(self, name: str = "b", **kw: object) -> Path:
        tree = make_bundle_tree(self.base / f"tree-{name}", **kw)  # type: ignore[arg-type]
        machine = str(kw.get("machine", "jetson-orin-nano-devkit"))
        deploy = self.base / "deploy" / machine
        deploy.mkdir(parents=True, exist_ok=True)
        return tar_gz(tree, deploy / f"{IMAGE}-{machine}.rootfs-20261130120000.tegraflash.tar.gz")

    def manifest(self, bundle: Path, machine: str = "jetson-orin-nano-devkit", *, sha: str | None = None) -> Path:
        m = Manifest(machine=machine, image=IMAGE)
        src = str(bundle)
        m.set("bundle_path", str(bundle), src)
        m.set("bundle_sha256", sha or sha256(bundle), src)
        m.set("bundle_bytes", bundle.stat().st_size, src)
        m.set("env_machine", machine, f"{src}:.env.initrd-flash")
        m.set("env_chipid", "0x23", f"{src}:.env.initrd-flash")
        path = manifest_path(self.root, IMAGE, machine)
        path.write_text(m.to_json())
        return path

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ALMA_", "KAS_"))}
        env.update(
            ALMA_ROOT=str(self.root),
            ALMA_FLASH_WORKDIR=str(self.work),
            PYTHONPATH=str(REPO / "src"),
        )
        env.update(extra)
        return env

    def alma(
        self, *args: str, device: str | None = "apx-7523-orin-nano-8gb", timeout: float = 60, **env: str
    ) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "alma", *args]
        if device is not None:
            umockdev = require_tool("umockdev-run")
            cmd = [umockdev, "--device", str(DEVICES / f"{device}.umockdev"), "--", *cmd]
        return subprocess.run(
            cmd, env=self.env(**env), capture_output=True, text=True, timeout=timeout, cwd=self.base, check=False
        )

    def records_list(self) -> list[dict[str, object]]:
        if not self.records.is_dir():
            return []
        return [json.loads(p.read_text()) for p in sorted(self.records.glob("*.json"))]

    def leftovers(self) -> list[Path]:
        """Anything unpacked that survived (nothing may, after a refusal or a run)."""
        if not self.work.exists():
            return []
        return [p for p in self.work.rglob("*")]


# What an Orin running ALMA-OS prints on ttyTCU0 (115200 8N1), abridged.
FLASHING_INITRD = b"[    0.000000] Linux version 5.15.185-l4t-r36.5-1033.33 (oe-user@oe-host) #1 SMP PREEMPT\r\n"
BOOT_LOG = (
    b"\x1b[0m\r\nJetson System firmware version 36.5.0-gcid-41062509 date 2026-01-12T00:00:00+00:00\r\n"
    b"ESC   to enter Setup.\r\n"
    b"L4TLauncher: Attempting Direct Boot\r\n"
    b"EFI stub: Booting Linux Kernel...\r\n"
    b"[    0.000000] Booting Linux on physical CPU 0x0000000000 [0x410fd421]\r\n"
    b"[    0.000000] Linux version 5.15.185-l4t-r36.5-1033.33 (oe-user@oe-host) (aarch64-oe-linux-gcc (GCC) 13.4.0, "
    b"GNU ld (GNU Binutils) 2.42.0.20240723) #1 SMP PREEMPT Tue Nov 24 10:00:00 UTC 2026\r\n"
    b"[    0.000000] Machine model: NVIDIA Jetson Orin Nano Engineering Reference Developer Kit\r\n"
    b"[    1.981213] systemd[1]: systemd 255.21^ running in system mode (+PAM +AUDIT -SELINUX -APPARMOR)\r\n"
    b"[    2.101001] systemd[1]: Hostname set to <alma-orin>.\r\n"
    b"[  \x1b[0;32m  OK  \x1b[0m] Reached target \x1b[0;1;39mMulti-User System\x1b[0m.\r\n"
    b"\r\nALMA-OS 0.1 alma-orin ttyTCU0\r\n\r\n"
    b"alma-orin login: "
)
