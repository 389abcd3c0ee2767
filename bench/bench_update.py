"""Benchmark: `alma update` of 4 virtual boards in one wave vs one board, in one run.

The boards are `alma lab`'s (docs/lab.md): the image's units, users and OTA configuration
under real systemd, reached over real ssh; the real SWUpdate writes each board's inactive slot
file, each board reboots for real (a container restart into the slot its bootloader state
names), proves healthy and is committed. All four boards are up during both runs, so the anchor
(one board updated alone) and the wave see the same idle neighbours.

By default every board shares this machine's cores, so four boards' reboots and Python starts
compete for them and the ratio is an upper bound for a real fleet, whose boards have cores of
their own. ``--cpus C`` holds each board to C cores of its own (`alma lab up --cpus`, CFS
bandwidth on its cgroup): the anchor's board and each board of the wave then work with the
same budget whatever the others do, as real boards do, and the ratio shows what the wave
itself costs (the desktop, its ssh, the slowest of four). Both are printed with the load.
Target: one wave of 4 boards <= 1.3x one board. Needs root (virtual boards) and swupdate.
Run: sudo .venv/bin/python bench/bench_update.py [ROUNDS, default 3] [--cpus C]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support_lab import virtual_fleet  # noqa: E402
from support_update import alma, make_cert, make_swu, records, require_swupdate  # noqa: E402

ARGS = ["--json", "--agent", "sudo -n alma-ota", "--poll", "0.5", "--boot-timeout", "300", "--health-timeout", "120"]


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def phases(desk: Path, swu: Path) -> str:
    """Each phase's wall time (the records' ``duration_s``): the slowest board's, summed per name."""
    worst: dict[str, float] = {}
    for rec in records(desk, swu).values():
        per: dict[str, float] = {}
        for p in rec.phases:
            per[p.name] = per.get(p.name, 0.0) + (p.duration_s or 0.0)
        for k, v in per.items():
            worst[k] = max(worst.get(k, 0.0), v)
    return "  ".join(f"{k} {v:.1f}" for k, v in worst.items())


def board_cpu(boards: list) -> float:
    """CPU seconds the boards' own cgroups (docs/lab.md) have used so far."""
    total = 0.0
    for b in boards:
        try:
            cg = Path((b.dir / "cgroup").read_text().strip())
            stat = dict(ln.split() for ln in (cg / "cpu.stat").read_text().splitlines())
        except (OSError, ValueError):
            continue
        total += int(stat.get("usage_usec", 0)) / 1e6
    return total


def settle(boards: list, quiet: float = 0.05, timeout: float = 120.0) -> float:
    """Wait until the boards are idle (under ``quiet`` CPU-s in a second, all four together):
    "ready" means ssh answers, while units of the boot may still run. An anchor started then
    shares the cores with its neighbours' boots (seen: 3.4 CPU-s in the boards' cgroups
    during the anchor instead of 1.8, the anchor 9.9 s instead of 5-7). Returns the wait."""
    t0 = time.monotonic()
    last = board_cpu(boards)
    while time.monotonic() - t0 < timeout:
        time.sleep(1.0)
        now = board_cpu(boards)
        if now - last < quiet:
            break
        last = now
    return time.monotonic() - t0


def desk_cpu() -> float:
    """CPU seconds of the desktop's side (alma update, its ssh clients) so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one_run(desk: Path, swu: Path, fleet: Path, *args: str) -> tuple[float, dict[str, str], int]:
    t0 = time.monotonic()
    r = alma(desk, "update", str(swu), "--fleet", str(fleet), *ARGS, *args)
    took = time.monotonic() - t0
    try:
        results = {b["node"]: b["result"] for b in json.loads(r.stdout)["boards"]}
    except (ValueError, KeyError):
        raise SystemExit(f"alma update exit {r.returncode}: {r.stdout}{r.stderr}") from None
    return took, results, r.returncode


def main() -> int:
    # One draw each is not a measurement here: SWUpdate 2022.12's `swupdate -i` returns after
    # ~0.1 s or ~1.1 s, about half the time each (docs/ota.md), and a wave waits for the slowest
    # of four. So the anchor and the wave alternate ROUNDS times in this one run, every figure is
    # printed, and the ratio is of the medians.
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rounds", nargs="?", type=int, default=3, help="anchor/wave pairs (default 3)")
    ap.add_argument("--cpus", type=float, default=None, help="each board's own CPU budget in cores (default: shared)")
    args = ap.parse_args()
    rounds = args.rounds
    require_swupdate()
    with tempfile.TemporaryDirectory(prefix="alma-bench-update-") as tmp:
        t = Path(tmp)
        signer = make_cert(t / "signer", "ALMA-OS bench OTA")
        budget = f"each board held to {args.cpus:g} cores" if args.cpus else "the boards share the host's cores"
        print(f"load before boot: {load()}; {os.cpu_count()} cores, {budget}")
        with virtual_fleet(4, ota_cert=signer[0], cpus=args.cpus) as (fleet, boards):
            print(f"4 virtual boards up; idle after {settle(boards):.1f} s more; load {load()}")
            ones: list[float] = []
            fours: list[float] = []
            failed = False
            for n in range(rounds):
                one_swu = make_swu(t, signer, f"1.{2 * n + 1}.0")
                cpu = board_cpu(boards), desk_cpu()
                one, res1, rc1 = one_run(t / f"one{n}", one_swu, fleet, "--node", boards[0].name)
                cpu1 = board_cpu(boards) - cpu[0], desk_cpu() - cpu[1]
                print(f"round {n + 1} one board:           {one:6.1f} s  {res1} exit {rc1}  load {load()}")
                print(f"  phases (s): {phases(t / f'one{n}', one_swu)}")
                print(f"  CPU (s): boards {cpu1[0]:.1f}  desktop {cpu1[1]:.1f}")
                wave_swu = make_swu(t, signer, f"1.{2 * n + 2}.0")
                print(f"  idle again after {settle(boards):.1f} s")
                cpu = board_cpu(boards), desk_cpu()
                four, res4, rc4 = one_run(t / f"four{n}", wave_swu, fleet, "--canary", "0", "--batch", "4")
                cpu4 = board_cpu(boards) - cpu[0], desk_cpu() - cpu[1]
                print(f"round {n + 1} 4 boards, one wave:  {four:6.1f} s  ratio {four / one:4.2f}x  "
                      f"exit {rc4}  load {load()}")  # fmt: skip
                print(f"  phases (s, slowest board): {phases(t / f'four{n}', wave_swu)}")
                print(f"  CPU (s): boards {cpu4[0]:.1f}  desktop {cpu4[1]:.1f}")
                print(f"  {json.dumps(res4)}")
                print(f"  idle again after {settle(boards):.1f} s")
                ones.append(one)
                fours.append(four)
                failed = failed or rc1 != 0 or rc4 != 0
            m1, m4 = statistics.median(ones), statistics.median(fours)
            print(f"median of {rounds} ({budget}): one board {m1:.1f} s, one wave of 4 {m4:.1f} s: ratio "
                  f"{m4 / m1:.2f}x (target <= 1.3x)  load {load()}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
