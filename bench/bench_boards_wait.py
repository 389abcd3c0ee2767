"""Board detection latency: udev add event -> `alma boards --wait` returning, vs a 1 s
sleep-polling loop (what find-jetson-usb and initrd-flash do) measured the same way.

    .venv/bin/python bench/bench_boards_wait.py [--runs 5]

Both run against the real libudev on a umockdev testbed (umockdev-wrapper). The event-driven
figure includes the whole `alma` process noticing the event, printing and exiting; the
polling loop's latency depends on where in its 1 s sleep the board arrives, so it is
measured at spread-out plug times. Target: alma < 100 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DRIVER = REPO / "tests" / "flash" / "hotplug_driver.py"


def scenario(name: str, **env: str) -> dict[str, object]:
    wrapper = shutil.which("umockdev-wrapper")
    if wrapper is None:
        raise SystemExit("umockdev-wrapper not found: apt-get install umockdev gir1.2-umockdev-1.0")
    e = {**os.environ, "PYTHONPATH": str(REPO / "src"), **env}
    r = subprocess.run([wrapper, sys.executable, str(DRIVER), name], capture_output=True, text=True, env=e, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    ours = []
    for _ in range(args.runs):
        out = scenario("cli-wait")
        assert out["rc"] == 0, out
        ours.append(float(out["latency_s"]))  # type: ignore[arg-type]
    polls = []
    for i in range(args.runs):
        plug_after = 0.05 + (i + 0.5) / args.runs  # spread over the 1 s poll period
        polls.append(float(scenario("poll-loop", PLUG_AFTER=f"{plug_after:.3f}")["latency_s"]))  # type: ignore[arg-type]
    m_ours, m_poll = statistics.median(ours), statistics.mean(polls)
    print(f"alma boards --wait (event-driven) : median {m_ours * 1000:6.1f} ms  runs {[round(x * 1000) for x in ours]}")
    print(
        f"1 s polling loop (anchor)         : mean   {m_poll * 1000:6.1f} ms  runs {[round(x * 1000) for x in polls]}"
    )
    print(f"ratio event / polling = {m_ours / m_poll:.3f}x")
    print(f"target alma < 100 ms: {'met' if m_ours < 0.1 else 'NOT met'}")


if __name__ == "__main__":
    main()
