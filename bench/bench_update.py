"""Benchmark: `alma update` of 4 simulated boards in waves vs one board, in one run.

Each board is tests/support_update.py's simulated A/B Jetson: its own REAL sshd on loopback
(pinned host key), the REAL SWUpdate writing its file-backed slot, the REAL alma-health, our
alma-ota agent; reboot = sshd down for 0.3 s. The anchor is one board updated alone.
Configurations: `--canary 0 --batch 4` (one wave), `--canary 0 --batch 3` (3 + 1) and the
default rollout shape `--canary 1 --batch 3` (1, then 3: the canary's verdict gates the rest,
so it costs about two board-times by design). One board fails health in the canary-1 run
(rolled back), as in docs/ota.md's demonstration.

Every board shares this machine's cores (and the simulated boards serialize their SWUpdate
runs: its sockets are host-wide), so the ratios are an upper bound for a real fleet.
Target: 4 boards <= 1.5x one board with --batch >= 3 in one wave.
Run: .venv/bin/python bench/bench_update.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support_swu import build_swu  # noqa: E402
from support_update import MACHINE, Lab, make_cert, require_swupdate, rootfs_image  # noqa: E402

# each health call is bounded by the health window: a loaded host needs seconds per call
FAST = ["--poll", "0.1", "--boot-timeout", "60", "--health-timeout", "15"]


def one_run(
    base: Path, signer: tuple[bytes, bytes], names: list[str], args: list[str], sick: str | None = None
) -> tuple[float, dict[str, str], int]:
    lab = Lab(base, signer[0], names)
    try:
        if sick:
            lab.boards[sick].set(sick=True)
        img = rootfs_image(base / "r.ext4", "1.1.0")
        swu = base / "u.swu"
        build_swu(swu, machine=MACHINE, version="1.1.0", rootfs=img, cert_pem=signer[0], key_pem=signer[1], root="")
        env = {**os.environ, "HOME": str(base / "home"), "XDG_STATE_HOME": str(base / "state")}
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "alma", "update", str(swu), "--fleet", str(lab.fleet), "--json",
                            *FAST, *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=900)  # fmt: skip
        took = time.monotonic() - t0
        results = {b["node"]: b["result"] for b in json.loads(r.stdout)["boards"]}
        return took, results, r.returncode
    finally:
        lab.close()


def main() -> int:
    require_swupdate()
    with tempfile.TemporaryDirectory(prefix="alma-bench-update-") as tmp:
        t = Path(tmp)
        signer = make_cert(t / "signer")
        one, res1, rc1 = one_run(t / "one", signer, ["b1"], ["--canary", "0"])
        print(f"one board:                          {one:6.1f} s  {res1} exit {rc1}")
        rows = [
            ("4 boards --canary 0 --batch 4", ["--canary", "0", "--batch", "4"], None),
            ("4 boards --canary 0 --batch 3", ["--canary", "0", "--batch", "3"], None),
            ("4 boards --canary 1 --batch 3, b3 sick", ["--canary", "1", "--batch", "3"], "b3"),
        ]
        for i, (label, args, sick) in enumerate(rows):
            took, res, rc = one_run(t / f"four{i}", signer, ["b1", "b2", "b3", "b4"], args, sick)
            print(f"{label:<38} {took:6.1f} s  ratio {took / one:4.2f}x  exit {rc}  {res}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
