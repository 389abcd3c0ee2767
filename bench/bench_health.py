"""Benchmark: one `alma-health` run (all seven checks) against Python's own start-up.

The project side is the real on-board script (`tools/guard/alma-health --root TREE`) on a
realistic fake board: Orin's 9 thermal zones, 4 interfaces, meminfo and PSI, a kernel log
of 5000 records (a full ring buffer's worth) with a few GPU faults, a fresh guard state,
the shipped fabric description, and saved counters from a previous run. The anchor is
`python3 -c pass` with the same interpreter: the floor any Python health check pays.
Target: < 200 ms per run.
Run: .venv/bin/python bench/bench_health.py [--runs 20]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support_guard import ALMA_HEALTH, GUARD_DIR, FakeBoard, orin_zones  # noqa: E402


def build(root: Path) -> FakeBoard:
    board = FakeBoard(root)
    orin_zones(board, 58.0)
    for i, name in enumerate(("eth0", "eth1", "eth2", "wlan0")):
        board.add_iface(name, multicast=1000 * i, rx_packets=100_000 * i, speed=10000 if i else 1000)
    board.set_meminfo(total_kb=32_000_000, avail_kb=21_000_000)
    board.set_psi(1.2, 0.1)
    board.write_guard_state()
    board.write_config("fabric.toml", (GUARD_DIR / "conf/fabric.toml").read_text())
    for i in range(5000):
        if i % 1000 == 999:
            board.add_kmsg("nvgpu: 17000000.gpu gk20a_fifo_handle_pbdma_intr:1123 [ERR]  pbdma fault")
        else:
            board.add_kmsg(f"usb 1-{i % 4}: some ordinary kernel message number {i}", prio=6)
    return board


def timed(argv: list[str], runs: int) -> tuple[list[float], list[float]]:
    """Wall time and CPU time (user+sys of the child) of each run."""
    wall, cpu = [], []
    for _ in range(runs):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        wall.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append((r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime))
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        board = build(Path(tmp) / "board")
        health = [sys.executable, str(ALMA_HEALTH), "--root", str(board.root)]
        first = subprocess.run(health, capture_output=True, text=True)
        print(f"one run: exit {first.returncode}: {first.stdout.splitlines()[0][:110]}...")
        h, hc = timed(health, args.runs)  # every run after the first reads and saves state, as on a board
        hj, hjc = timed([*health, "--json"], args.runs)
        anchor, ac = timed([sys.executable, "-c", "pass"], args.runs)
        med = statistics.median
        print(f"load average now: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (wall times include waiting)")
        print(f"alma-health (line)       wall median {med(h) * 1e3:6.1f} ms   CPU median {med(hc) * 1e3:6.1f} ms")
        print(f"alma-health --json       wall median {med(hj) * 1e3:6.1f} ms   CPU median {med(hjc) * 1e3:6.1f} ms")
        print(f"anchor: python3 -c pass  wall median {med(anchor) * 1e3:6.1f} ms   CPU median {med(ac) * 1e3:6.1f} ms")
        print(f"ratio alma-health / python start-up: wall {med(h) / med(anchor):5.2f}x  CPU {med(hc) / med(ac):5.2f}x")
        print(
            f"target < 200 ms per run: wall {'MET' if med(h) < 0.200 else 'NOT MET'}, "
            f"CPU {'MET' if med(hc) < 0.200 else 'NOT MET'} (CPU time = wall time on an idle board)"
        )


if __name__ == "__main__":
    main()
