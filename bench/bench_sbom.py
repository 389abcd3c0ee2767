"""Benchmark: `alma verify` with supply-chain facts on a deploy dir holding a 1,500-package
SPDX SBOM (3.0.1 JSON-LD, and the 2.2 tarball in a second run) and a 200-package cve-check
report of 8 CVEs each, 1,600 CVEs (targets: <= 0.5 s and <= 64 MB peak RSS for 1,500 packages
and 200 CVEs, CLI start-up included; this run reads 8x the CVEs).

Anchor, in the same run: the same verify of the same deploy dir without the SBOM and CVE
files (what the supply-chain facts add is the difference), and `python -c "import json;
json.load(...)"` of the SPDX file (the least a reader must do). Peak RSS is the child's
ru_maxrss (the largest child so far: an upper bound per line).
Run: .venv/bin/python bench/bench_sbom.py [--packages 1500] [--cve-packages 200]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from artefacts import sbomfix as sf  # noqa: E402
from artefacts.alma_deployfix import build_deploy  # noqa: E402

ALMA = REPO / ".venv" / "bin" / "alma"
LINK = "alma-image-jetson-orin-nano-devkit.rootfs"


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


CPU: dict[str, float] = {}  # label -> the child's user+sys seconds (steadier than wall time on a loaded host)


def _run(argv: list[str], label: str = "") -> tuple[float, float]:
    """(seconds, peak RSS MB) of one child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    cpu0 = _cpu()
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{argv}: exit {proc.returncode}\n{proc.stderr}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    CPU[label] = _cpu() - cpu0
    return dt, max(peak, before) / 1024


def _cve(n: int) -> dict:
    pkgs = []
    for i in range(n):
        issues = [sf.issue(f"CVE-2024-{i * 10 + j:05d}", ("Patched", "Unpatched", "Ignored")[j % 3],
                           v3=f"{(i + j) % 10}.{j}" if j % 4 else "0.0", v2=f"{(i + j) % 10}.5",
                           detail="fixed-version" if j % 3 != 1 else None,
                           reason="reviewed: not built" if j % 3 == 2 and i % 2 else None)
                  for j in range(8)]  # fmt: skip
        pkgs.append(sf.package(f"pkg{i}", "1.0", issues, known=i % 7 != 0))
    return {"version": "1", "package": pkgs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--packages", type=int, default=1500)
    ap.add_argument("--cve-packages", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="alma-bench-sbom-") as tmp:
        root = Path(tmp) / "proj"
        (root / "facts").mkdir(parents=True)
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        d = build_deploy(root, payload=10_000)
        env = dict(os.environ, ALMA_ROOT=str(root), XDG_CACHE_HOME=str(Path(tmp) / "cache"))
        base = [str(ALMA), "verify", str(d.dir), "--root", str(root)]
        subprocess.run(base, env=env, capture_output=True, check=True)  # warm the bundle hash cache
        t_plain, rss_plain = _run(base, "plain")
        licences = {f"pkg{i}": ("LicenseRef-Proprietary" if i % 50 == 0 else "MIT") for i in range(args.packages)}
        spdx = sf.write_spdx3(d.dir, LINK, licences)
        sf.write_cve(d.dir, LINK, _cve(args.cve_packages))
        t3, rss3 = _run(base, "spdx3")
        t_json, _ = _run([sys.executable, "-c", f"import json; json.load(open({str(spdx)!r}))"])
        for p in (spdx, d.dir / f"{LINK}.spdx.json"):
            p.unlink()
        sf.write_spdx22(d.dir, LINK, sf.spdx22_tar(licences))
        t2, rss2 = _run(base, "spdx22")
        print(f"SPDX 3.0.1 {args.packages} packages + cve-check {args.cve_packages} packages "
              f"({args.cve_packages * 8} CVEs): {t3:.2f} s, peak RSS {rss3:.0f} MB "
              "(target <= 0.5 s, <= 64 MB)")  # fmt: skip
        print(f"SPDX 2.2 tarball {args.packages} packages + the same cve-check: {t2:.2f} s, peak RSS {rss2:.0f} MB")
        print(f"anchor: verify without supply-chain files {t_plain:.2f} s ({rss_plain:.0f} MB); "
              f"json.load of the SPDX file alone {t_json:.2f} s; supply chain adds {t3 - t_plain:.2f} s "
              f"(ratio {t3 / t_plain:.2f}x)")  # fmt: skip
        print(f"CPU (user+sys) of each child: SPDX 3.0.1 {CPU['spdx3']:.2f} s, SPDX 2.2 {CPU['spdx22']:.2f} s, "
              f"without supply-chain files {CPU['plain']:.2f} s; load average {os.getloadavg()[0]:.1f} "
              f"on {os.cpu_count()} CPUs")  # fmt: skip


if __name__ == "__main__":
    main()
