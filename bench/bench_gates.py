"""Benchmark: `alma gates check` over 200 generated gate documents (target < 1 s).

Anchor, in the same run: the bare CLI start-up (`alma --version`), so the printed ratio
shows what checking 200 documents costs on top of starting the program. Each document has
front matter claims and inline markers (sizes with tolerance, version prefixes, a jinja2
filter, status derived from flash records) and a paragraph scanned for unmarked claims.
Run: .venv/bin/python bench/bench_gates.py [--docs 200]
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


def best(argv: list[str], env: dict[str, str], runs: int = 3) -> tuple[float, int]:
    times, code = [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        code = subprocess.run(argv, env=env, capture_output=True, check=False).returncode
        times.append(time.perf_counter() - t0)
    return min(times), code


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=200)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="alma-bench-gates-"))
    try:
        root = tmp / "proj"
        setup(root, args.docs)
        env = {**os.environ, "ALMA_ROOT": str(root)}
        t_start, _ = best([str(ALMA), "--version"], env)
        t_check, code = best([str(ALMA), "gates", "check"], env)
        if code != 0:
            out = subprocess.run([str(ALMA), "gates", "check"], env=env, capture_output=True, text=True, check=False)
            print(out.stdout[-2000:], out.stderr[-2000:], file=sys.stderr)
            return 1
        claims = args.docs * 14
        print(f"alma --version (anchor: CLI start-up)   {t_start:6.3f} s")
        print(f"alma gates check, {args.docs} docs, {claims} claims  {t_check:6.3f} s   exit {code}")
        print(f"ratio check/start-up                     {t_check / t_start:6.2f} x")
        met = "MET" if t_check < 1.0 else "MISSED"
        print(f"target < 1.000 s                                    {met}")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
