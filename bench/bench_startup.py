"""Start-up time: `alma --help` vs `kas --help` (both from this venv), interleaved runs.

alma's verbs load lazily (alma.cli.main.VERBS), so `alma --help` must not import kas, rich,
yaml or any verb module. Target: ratio <= 1.0.

    .venv/bin/python bench/bench_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET = 1.0


def tool(name: str) -> str:
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise SystemExit(f"{name} not found next to {sys.executable} or on PATH")
    return found


def once(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    alma, kas = [tool("alma"), "--help"], [tool("kas"), "--help"]
    once(alma), once(kas)  # warm the page cache for both
    times: dict[str, list[float]] = {"alma --help": [], "kas --help": [], "alma build --help": []}
    for _ in range(args.runs):
        times["alma --help"].append(once(alma))
        times["kas --help"].append(once(kas))
        times["alma build --help"].append(once([alma[0], "build", "--help"]))
    print(f"{args.runs} runs each, interleaved")
    for name, ts in times.items():
        print(f"  {name:<18} best {min(ts) * 1000:6.1f} ms   median {statistics.median(ts) * 1000:6.1f} ms")
    ratio = statistics.median(times["alma --help"]) / statistics.median(times["kas --help"])
    ratio_b = statistics.median(times["alma build --help"]) / statistics.median(times["kas --help"])
    print(
        f"ratio alma --help / kas --help: {ratio:.2f}  (target <= {TARGET}) {'MET' if ratio <= TARGET else 'NOT MET'}"
    )
    print(f"ratio alma build --help / kas --help: {ratio_b:.2f}  (informative: loads the build verb)")


if __name__ == "__main__":
    main()
