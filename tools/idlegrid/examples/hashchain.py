#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Example ERAN-GRID workload: iterate SHA-256 over a seed N times, checkpointing as it goes.

A real computation (not a sleep) whose answer does not depend on how often it was stopped:
the digest after N steps is the same whether it ran straight through or resumed ten times.

    hashchain.py --steps N [--seed TEXT] [--every SECONDS]

The seed defaults to the job's input (stdin). With ERAN_GRID_CHECKPOINT_DIR set, it writes
``state.json`` there (atomically) every ``--every`` seconds and on SIGTERM, then exits 75
(EX_TEMPFAIL: "stopped, resume me"); at start it resumes from that file. Prints one JSON line:
{"steps": N, "digest": HEX, "resumed_from": K, "checkpoints": C}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time

EX_TEMPFAIL = 75


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seed")
    ap.add_argument("--every", type=float, default=1.0, help="seconds between checkpoints")
    args = ap.parse_args()
    seed = args.seed.encode() if args.seed is not None else sys.stdin.buffer.read()
    ckpt_dir = os.environ.get("ERAN_GRID_CHECKPOINT_DIR")
    state_path = os.path.join(ckpt_dir, "state.json") if ckpt_dir else None

    step, digest, resumed_from = 0, hashlib.sha256(seed).digest(), 0
    if state_path and os.path.exists(state_path):
        with open(state_path) as fh:
            state = json.load(fh)
        if state.get("seed") == hashlib.sha256(seed).hexdigest() and state.get("steps") == args.steps:
            step, digest, resumed_from = int(state["step"]), bytes.fromhex(state["digest"]), int(state["step"])
    checkpoints = 0
    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))

    def save() -> None:
        nonlocal checkpoints
        if not state_path:
            return
        tmp = state_path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(
                {"seed": hashlib.sha256(seed).hexdigest(), "steps": args.steps, "step": step, "digest": digest.hex()},
                fh,
            )
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, state_path)
        checkpoints += 1

    next_save = time.monotonic() + args.every
    sha = hashlib.sha256
    while step < args.steps:
        chunk = min(2000, args.steps - step)
        for _ in range(chunk):
            digest = sha(digest).digest()
        step += chunk
        if stop["flag"]:
            save()
            return EX_TEMPFAIL
        if time.monotonic() >= next_save:
            save()
            next_save = time.monotonic() + args.every
    print(
        json.dumps(
            {"steps": args.steps, "digest": digest.hex(), "resumed_from": resumed_from, "checkpoints": checkpoints}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
