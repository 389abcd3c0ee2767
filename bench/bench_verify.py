"""Benchmark: `alma verify` on a generated 1.6 GB tegraflash bundle.

Anchor: `sha256sum` of the same file, in the same run (the least any honest verify must do:
read and hash every byte). Targets: first run <= 1.1x sha256sum (one pass: hash + tar
scan together); second run (cache hit) < 0.3 s absolute, CLI start-up included.

The bundle is a real gzip'd tar (random data: incompressible, like a real bundle's
compressed rootfs) with .env.initrd-flash written LAST, so the scan must inflate the whole
stream (worst case). The cached run is also measured for the code before the loader
(bench/oldcode.BASE_REV, its own cache) in the same run: the loader must not slow it.
Run: .venv/bin/python bench/bench_verify.py [--size-mb 1600] [--old-rev REV]
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from artefacts.alma_deployfix import build_deploy, env_text  # noqa: E402

ALMA = REPO / ".venv" / "bin" / "alma"
sys.path.insert(0, str(REPO / "bench"))
from oldcode import BASE_REV, env_for, old_src  # noqa: E402


class _RandomFile:
    """A file-like source of `size` pseudo-random bytes (repeated os.urandom blocks)."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.blocks = [os.urandom(1 << 20) for _ in range(8)]
        self.i = 0

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        out = bytearray()
        while len(out) < n:
            b = self.blocks[self.i % len(self.blocks)]
            self.i += 1
            out += b[: n - len(out)]
        self.left -= len(out)
        return bytes(out)


def make_bundle(path: Path, machine: str, image: str, payload: int) -> None:
    # zlib level 0 = deflate stored blocks: what gzip -9 emits for incompressible data anyway,
    # without spending a minute compressing random bytes.
    with (
        gzip.open(path, "wb", compresslevel=0) as gz,
        tarfile.open(fileobj=gz, mode="w|", format=tarfile.GNU_FORMAT) as tar,
    ):

        def add(name: str, data: bytes | None = None, size: int = 0) -> None:
            ti = tarfile.TarInfo(name)
            ti.size = len(data) if data is not None else size
            ti.mode = 0o644
            tar.addfile(ti, __import__("io").BytesIO(data) if data is not None else _RandomFile(size))

        for name in ("flash.xml.in", "initrd-flash", "doflash.sh", "boot.img", "esp.img"):
            add(name, os.urandom(4096))
        add(f"{image}.ext4", size=payload)
        add(".env.initrd-flash", env_text(machine, image).encode())  # last: the whole stream is inflated


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[bytes]]:
    t0 = time.perf_counter()
    cp = subprocess.run(argv, env=env, capture_output=True, check=False)
    return time.perf_counter() - t0, cp


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1600)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--old-rev", default=BASE_REV)
    args = ap.parse_args()
    if not shutil.which("sha256sum"):
        print("sha256sum not found (coreutils)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="alma-bench-verify-"))
    try:
        root = tmp / "proj"
        for d in ("kas", "layers", "facts"):
            (root / d).mkdir(parents=True)
        d = build_deploy(root)
        t0 = time.perf_counter()
        make_bundle(d.bundle, d.machine, d.image, args.size_mb * 1_000_000)
        size = d.bundle.stat().st_size
        print(f"generated {d.bundle.name}: {size / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s")
        env = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache"), "ALMA_ROOT": str(root)}
        subprocess.run(["cat", str(d.bundle)], stdout=subprocess.DEVNULL, check=True)  # both runs from page cache

        t_sum, cp = timed(["sha256sum", str(d.bundle)], env)
        want = cp.stdout.split()[0].decode()
        t_first, cp1 = timed([str(ALMA), "verify", str(d.dir), "--json"], env)
        if cp1.returncode != 0:
            print(cp1.stderr.decode(), file=sys.stderr)
            return 1
        got = __import__("json").loads(cp1.stdout)["facts"]["bundle_sha256"]["value"]
        assert got == want, (got, want)
        t_second, cp2 = timed([str(ALMA), "verify", str(d.dir)], env)
        assert cp2.returncode == 0, cp2.stderr
        t_sum2, _ = timed(["sha256sum", str(d.bundle)], env)
        t_sum = min(t_sum, t_sum2)

        ratio = t_first / t_sum
        print(f"sha256sum (anchor)        {t_sum:7.2f} s   {size / t_sum / 1e6:7.0f} MB/s")
        rate = size / t_first / 1e6
        print(f"alma verify, first run    {t_first:7.2f} s   {rate:7.0f} MB/s  (hash + full tar scan, one pass)")
        met = "MET" if ratio <= 1.10 else "MISSED"
        print(f"ratio first/sha256sum     {ratio:7.2f} x   target <= 1.10 x   {met}")
        t_second = min(t_second, *(timed([str(ALMA), "verify", str(d.dir)], env)[0] for _ in range(4)))
        met = "MET" if t_second < 0.3 else "MISSED"
        print(f"alma verify, cached run   {t_second:7.3f} s   target < 0.300 s   {met}")
        old = old_src(args.old_rev, tmp / "old")
        if old:
            old_env = env_for(old, {**env, "XDG_CACHE_HOME": str(tmp / "cache-old")})
            argv = [sys.executable, "-m", "alma", "verify", str(d.dir)]
            cp0 = subprocess.run(argv, env=old_env, capture_output=True, check=False)  # fills its cache
            if cp0.returncode != 0:
                print(f"old revision {args.old_rev} failed: {cp0.stderr.decode()[-500:]}", file=sys.stderr)
                return 0
            t_old = min(timed(argv, old_env)[0] for _ in range(5))
            t_new = min(
                timed([sys.executable, "-m", "alma", "verify", str(d.dir)], env_for(None, env))[0] for _ in range(5)
            )
            met = "MET" if t_new <= t_old * 1.10 else "MISSED"
            print(
                f"cached run, old vs new    old {t_old:6.3f} s   new {t_new:6.3f} s   new/old {t_new / t_old:5.2f} x   "
                f"target <= 1.10 x   {met}"
            )
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
