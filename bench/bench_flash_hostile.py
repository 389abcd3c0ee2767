"""Hostile bundles through `alma verify`'s reader on every interpreter the station
runs, side by side with the interpreter's own tarfile (the anchor: what the reader was before).

    .venv/bin/python bench/bench_flash_hostile.py [--limit S] [--python PATH ...]

For each hostile kind (tests/flash/hostile_tar.py) and each interpreter (default: Debian's
/usr/bin/python3 = 3.11.2 and pyenv's 3.11.7, 3.12.x, 3.13.x when present), a fresh process
reads the bundle once with alma.tegraflash.reader.scan and once with tarfile (a listing, what
scan did before), and reports the read's wall time (interpreter start-up and imports shown
apart: on a loaded host they alone took 2-3 s), peak RSS (VmHWM) and the verdict. Targets: every kind
refused in < 2 s and < 100 MB; tarfile is capped at --limit seconds (a hang shows as ">limit").
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from flash import hostile_tar as H  # noqa: E402

PROBE = r"""
import sys, time
from pathlib import Path
how, path = sys.argv[1], sys.argv[2]
t_start = time.monotonic()
if how == "alma":
    from alma.errors import UserError
    from alma.tegraflash import reader
else:
    import tarfile
t0 = time.monotonic()  # the read alone: interpreter start-up and imports are not the bundle's doing
verdict = "ACCEPTED"
try:
    if how == "alma":
        try:
            reader.scan(Path(path))
        except UserError as exc:
            verdict = "refused"
    else:
        with tarfile.open(path) as t:
            for _ in t:
                pass
except Exception as exc:
    verdict = "crash:" + type(exc).__name__
hwm = [ln.split()[1] for ln in open("/proc/self/status") if ln.startswith("VmHWM")][0]
print(f"{time.monotonic() - t0:.3f} {int(hwm) // 1024} {verdict} {t0 - t_start:.3f}")
"""


def interpreters() -> list[str]:
    found = ["/usr/bin/python3"] if os.access("/usr/bin/python3", os.X_OK) else []
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for minor in ("3.11", "3.12", "3.13"):
        found += sorted(glob.glob(str(root / f"{minor}.*" / "bin" / "python3")))[-1:]
    return found


def run(python: str, how: str, path: Path, limit: float) -> str:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO / 'tools' / 'board'}"}
    try:
        out = subprocess.run(
            [python, "-c", PROBE, how, str(path)], capture_output=True, text=True, timeout=limit, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return f">{limit:.0f}s   -     hang (killed)"
    if out.returncode != 0 or not out.stdout.strip():
        return f"error: {out.stderr.strip().splitlines()[-1:] or out.returncode}"
    secs, mb, verdict, start = out.stdout.split()
    return f"{float(secs):6.2f}s {int(mb):5d} MB {verdict} (+{float(start):.1f}s start)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=float, default=30.0, help="seconds tarfile may take per kind")
    ap.add_argument("--python", action="append", help="interpreter(s) to measure (default: all found)")
    args = ap.parse_args()
    pythons = args.python or interpreters()
    worst_s = worst_mb = 0.0
    failed = []
    with tempfile.TemporaryDirectory(prefix="alma-hostile-") as d:
        paths = {}
        for kind, build in H.KINDS.items():
            p = Path(d) / f"{kind}.tegraflash.tar.gz"
            p.write_bytes(H.gz(build()))
            paths[kind] = p
        for python in pythons:
            ver = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                                 text=True, check=True).stdout.strip()  # fmt: skip
            print(f"\n== {python} (Python {ver})")
            print(f"{'kind':30} {'bytes':>7}  {'alma reader':44} tarfile (anchor)")
            for kind, p in paths.items():
                mine = run(python, "alma", p, max(args.limit, 10))
                anchor = run(python, "tarfile", p, args.limit)
                print(f"{kind:30} {p.stat().st_size:7d}  {mine:44} {anchor}")
                if "refused" not in mine:  # accepted, crashed or killed at the limit
                    failed.append(f"{ver} {kind}")
                    continue
                secs, mb = float(mine.split("s")[0]), float(mine.split()[1])
                worst_s, worst_mb = max(worst_s, secs), max(worst_mb, mb)
                if secs >= 2 or mb >= 100:
                    failed.append(f"{ver} {kind}")
    print(f"\nworst: {worst_s:.2f} s, {worst_mb:.0f} MB peak RSS (targets < 2 s, < 100 MB)")
    if failed:
        print("MISSED: " + ", ".join(failed))
        return 1
    print("every hostile kind refused within the targets on every interpreter")
    return 0


if __name__ == "__main__":
    t0 = time.monotonic()
    code = main()
    print(f"(bench took {time.monotonic() - t0:.0f} s)")
    sys.exit(code)
