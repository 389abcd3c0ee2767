"""Benchmark: `alma gates check` over 200 generated gate documents (target < 1 s), and one
large gate document (15, 30 and 60 MB of prose: target < 1 s at 60 MB, linear in size).

Anchors, in the same run: the bare CLI start-up (`alma --version`), and the code before
the loader and the linear marker scan (git revision bench/oldcode.BASE_REV run beside this one), so every line prints
old, new and their ratio. Each small document has front matter claims and inline markers
(sizes with tolerance, version prefixes, a jinja2 filter, status derived from flash
records) and a paragraph scanned for unmarked claims; the large one is that document with
its prose paragraph repeated (a line of markers per block), the shape of a long report.
Run: .venv/bin/python bench/bench_gates.py [--docs 200] [--big-mb 60] [--old-rev REV]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ALMA = REPO / ".venv" / "bin" / "alma"
sys.path.insert(0, str(REPO / "src"))

from alma.artefacts.manifest import Manifest, manifest_path  # noqa: E402
from alma.artefacts.verify import ARTEFACT_FACTS  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
from oldcode import BASE_REV, alma_argv, env_for, old_src  # noqa: E402

PROSE = (
    "The thermal guard, the health watchdog and ERAN-GRID, which is opt-in and default off, pause on heat\n"
    "and yield the instant their owner returns; nothing in this paragraph is a checkable claim.\n"
)

DOC = """---
gate: bench-{i}
machine: {machine}
image: alma-image
claims:
  image_buildable: true
  kernel_version: 5.15.185-l4t-r36.5
  kernel_image_bytes: 41 MB
  bundle_bytes: 1.6 GB
  package_count: 812
  status: Prototype
  flashed: false
  components:
    alma-guard: true
    eran-grid: false
---
# Gate {i}

The kernel is <!-- fact:kernel_version -->5.15.185<!-- /fact -->, its image
<!-- fact:kernel_image_bytes -->41 MB<!-- /fact --> and the bundle <!-- fact:bundle_bytes -->1.6 GB<!-- /fact -->
(sha256 <!-- fact:bundle_sha256 | short(12) -->abababababab<!-- /fact -->).

Guard baked in: <!-- fact:components.alma-guard -->yes<!-- /fact -->. This paragraph is prose about
the thermal guard, the health watchdog and ERAN-GRID, which is opt-in and default off; it
pauses on heat and yields the instant its owner returns. Nothing here is a checkable claim.
"""

MACHINES = [
    "jetson-orin-nano-devkit",
    "jetson-orin-nano-devkit-nvme",
    "jetson-agx-orin-devkit",
    "p3768-0000-p3767-0000",
]


def setup(root: Path, n: int) -> None:
    for d in ("kas", "layers", "docs/gates"):
        (root / d).mkdir(parents=True)
    for machine in MACHINES:
        m = Manifest(machine, "alma-image", generated="2026-11-30T12:00:00Z")
        for name in ARTEFACT_FACTS:
            m.set(name, None, "bench")
        for name, value in {
            "image_buildable": True,
            "kernel_version": "5.15.185-l4t-r36.5-1033.33+g9c6d5c8154",
            "kernel_image_bytes": 41_287_168,
            "bundle_bytes": 1_612_000_000,
            "bundle_sha256": "ab" * 32,
            "package_count": 812,
            "components": {"alma-guard": True, "eran-grid": False},
        }.items():
            m.set(name, value, "bench")
        path = manifest_path(root, "alma-image", machine)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(m.to_json())
    for i in range(n):
        (root / "docs" / "gates" / f"gate-{i:03}.md").write_text(DOC.format(i=i, machine=MACHINES[i % len(MACHINES)]))


def big_doc(root: Path, mb: int) -> Path:
    """gate-000.md grown to ``mb`` MB: its front matter and markers, then prose to the size."""
    doc = root / "docs" / "gates" / "gate-000.md"
    head = doc.read_text()
    n = (mb * 1_000_000 - len(head)) // len(PROSE)
    doc.write_text(head + PROSE * n)
    return doc


def best(argv: list[str], env: dict[str, str], runs: int = 3) -> tuple[float, int]:
    times, code = [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        code = subprocess.run(argv, env=env, capture_output=True, check=False).returncode
        times.append(time.perf_counter() - t0)
    return min(times), code


def best_pair(argv: list[str], old_env: dict[str, str], new_env: dict[str, str], runs: int) -> tuple[float, float]:
    """Best times of the old and the new code, runs interleaved so load drift hits both alike."""
    old_t, new_t = [], []
    for _ in range(runs):
        for env, times in ((old_env, old_t), (new_env, new_t)):
            t0 = time.perf_counter()
            subprocess.run(argv, env=env, capture_output=True, check=False)
            times.append(time.perf_counter() - t0)
    return min(old_t), min(new_t)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=200)
    ap.add_argument("--big-mb", type=int, default=60)
    ap.add_argument("--old-rev", default=BASE_REV)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="alma-bench-gates-"))
    try:
        old = old_src(args.old_rev, tmp / "old")
        root = tmp / "proj"
        setup(root, args.docs)
        env = {**os.environ, "ALMA_ROOT": str(root)}
        new_env, old_env = env_for(None, env), env_for(old, env)
        check = [*alma_argv(), "gates", "check"]
        t_start, _ = best([*alma_argv(), "--version"], new_env)
        t_check, code = best(check, new_env)
        if code != 0:
            out = subprocess.run(check, env=new_env, capture_output=True, text=True, check=False)
            print(out.stdout[-2000:], out.stderr[-2000:], file=sys.stderr)
            return 1
        claims = args.docs * 14
        print(f"alma --version (anchor: CLI start-up)        {t_start:7.3f} s")
        line = f"gates check, {args.docs} docs, {claims} claims"
        if old:
            t_old, t_check = best_pair(check, old_env, new_env, runs=15)
            print(f"{line:<44} old {t_old:7.3f} s   new {t_check:7.3f} s   new/old {t_check / t_old:5.2f} x")
        else:
            print(f"{line:<44} new {t_check:7.3f} s")
        if old:
            print(f"  target: within 10 % of old: {'MET' if t_check <= 1.10 * t_old else 'MISSED'}")
        print(f"  target: < 1 s: {'MET' if t_check < 1.0 else 'MISSED'}")

        big_root = tmp / "big"
        setup(big_root, 1)
        big_env = {**os.environ, "ALMA_ROOT": str(big_root)}
        sizes = sorted({max(1, args.big_mb // 4), max(1, args.big_mb // 2), args.big_mb})
        per_mb = []
        for mb in sizes:
            big_doc(big_root, mb)
            t_new, code = best(check, env_for(None, big_env))
            assert code == 0, f"big doc: exit {code}"
            per_mb.append((t_new - t_start) / mb)
            line = f"gates check, one {mb} MB doc"
            if old and mb == args.big_mb:
                t_old, _ = best(check, env_for(old, big_env), runs=1)
                print(f"{line:<44} old {t_old:7.3f} s   new {t_new:7.3f} s   new/old {t_new / t_old:5.3f} x")
            else:
                print(f"{line:<44} new {t_new:7.3f} s")
        spread = max(per_mb) / min(per_mb)
        print(f"  linear: seconds per MB (less start-up) vary {spread:4.2f} x across sizes (1.00 = linear)")
        t_big = t_new
        print(f"  target: {args.big_mb} MB < 1 s: {'MET' if t_big < 1.0 else 'MISSED'} ({t_big:.3f} s)")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
