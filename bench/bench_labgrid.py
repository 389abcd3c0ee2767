"""A simulated flash driven through labgrid vs `alma flash` directly, in one run.

Anchor: `alma flash --board 1-3 --yes` under umockdev-run (a process of its own, as a technician
runs it). Project: `labgrid-client -c ENV -p PLACE -s flashed io get` from a second process
against a real coordinator and exporter on loopback (place already acquired; the exporter
runs the same FlashSession). Both flash the same simulated bundle; the ratio is wall time.

A third figure separates labgrid's process start from the pool's per-flash cost: one client
process (as the pytest plugin is for a CI run) loads the env once and walks the strategy
off -> flashed ROUNDS times; each walk is timed inside it.

    .venv/bin/python bench/bench_labgrid.py [ROUNDS]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support_labgrid import Lab


def in_process(env_file: str, place: str, rounds: int) -> int:
    """The second process of the in-process figure: prints one flash time per line."""
    from labgrid import Environment

    target = Environment(env_file).get_target(place)
    strategy = target.get_driver("AlmaStrategy")
    for _ in range(rounds):
        strategy.transition("off")
        t0 = time.monotonic()
        strategy.transition("flashed")
        print(f"{time.monotonic() - t0:.3f}", flush=True)
    target.cleanup()
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--in-process"]:
        return in_process(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with tempfile.TemporaryDirectory(prefix="bench-labgrid-") as tmp:
        lab = Lab(Path(tmp))
        try:
            lab.start_coordinator()
            lab.start_exporter()
            place = lab.place()
            lab.ok("-p", place, "acquire")
            bundle = lab.client.bundle("b")
            lab.client.manifest(bundle)
            lab.station.manifest(bundle)  # the direct run verifies against the same facts
            env = lab.env_file(place, bundle)
            direct, via, client = [], [], []
            for _ in range(rounds):
                t0 = time.monotonic()
                r = lab.station.alma("flash", str(bundle), "--board", "1-3", "--yes", timeout=120)
                direct.append(time.monotonic() - t0)
                assert r.returncode == 0, r.stderr[-2000:]
                t0 = time.monotonic()
                r2 = lab.client_cmd("-c", str(env), "-p", place, "-s", "flashed", "io", "get", timeout=120)
                via.append(time.monotonic() - t0)
                assert r2.returncode == 0, r2.stderr[-2000:]
                t0 = time.monotonic()
                lab.ok("-p", place, "show")  # labgrid-client's own cost: start, connect, sync
                client.append(time.monotonic() - t0)
            r3 = subprocess.run(
                [sys.executable, __file__, "--in-process", str(env), place, str(rounds)],
                capture_output=True, text=True, timeout=120 * rounds, env=lab.env(), cwd=lab.base, check=False,
            )  # fmt: skip
            assert r3.returncode == 0, r3.stderr[-2000:]
            inproc = [float(x) for x in r3.stdout.split()]
            d, v = statistics.median(direct), statistics.median(via)
            print(f"alma flash directly       : {d:6.2f} s (median of {rounds})")
            print(f"labgrid-client -s flashed : {v:6.2f} s (median of {rounds})")
            c = statistics.median(client)
            print(f"labgrid-client show       : {c:6.2f} s (its start + coordinator sync, no flash)")
            print(f"ratio labgrid / direct    : {v / d:6.2f}x (target <= 1.1x)")
            print(f"fixed cost of the pool    : {v - d:6.2f} s per flash (a real Orin flash takes minutes)")
            i = statistics.median(inproc)
            print(f"strategy in one client    : {i:6.2f} s (median of {rounds}; labgrid started once, as in a CI run)")
            print(f"ratio in-process / direct : {i / d:6.2f}x")
        finally:
            lab.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
