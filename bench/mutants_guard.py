"""Mutation check of the guard's fault-injection state machine (tests/guard/test_guard_faults.py).

For each mutant (one rule of the guard patched out: shedding on heat, failing closed, the
range and rate plausibility rules, blind zones blocking a resume, a rejected hot jump still
shedding, recovery from the machine, I/O errors never raising, SIGTERM keeping blind work
paused, vanished zones staying on the list; and the trust invariants: zones by path, thaw retries,
clocks, blind-is-hot, descriptor budget, stuck flags, new zones at once, alma-health's typed
state), run the state machine and the attacks of tests/guard/test_guard_trust.py with that
mutant and report whether it was caught (the run fails with an invariant violation). Every mutant must
be caught; the unmutated guard must pass. Prints one line per run and exits 1 on a survivor.
Run: .venv/bin/python bench/mutants_guard.py [--examples 100] [--seeds 8]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "guard"))
sys.path.insert(0, str(REPO / "tools" / "guard"))


def run(mutant: str, examples: int, seeds: int) -> tuple[bool, str, float]:
    """Run the machine with ``mutant`` under up to ``seeds`` hypothesis seeds; (passed, why, s)."""
    env = {**os.environ, "ALMA_GUARD_MUTANT": mutant, "ALMA_GUARD_FAULT_EXAMPLES": str(examples)}
    t0 = time.monotonic()
    for seed in range(seeds):
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", f"--hypothesis-seed={seed}",
             "tests/guard/test_guard_trust.py", "tests/guard/test_guard_faults.py"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        if r.returncode != 0:
            m = re.search(r"AssertionError: (\(\d\)[^\n]*)", r.stdout) or re.search(r"E\s+(\w+Error: [^\n]*)", r.stdout)
            return False, f"seed {seed}: " + (m.group(1)[:100] if m else r.stdout[-100:]), time.monotonic() - t0
    return True, "", time.monotonic() - t0


def main() -> int:
    from test_guard_faults import MUTANTS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=100)
    ap.add_argument("--seeds", type=int, default=8, help="hypothesis seeds per mutant (stop at the first catch)")
    ap.add_argument("--only", action="append", help="run only this mutant (repeatable)")
    args = ap.parse_args()
    ok, _, dt = run("", args.examples, args.seeds)
    print(f"{'(no mutant)':34} {'passes' if ok else 'FAILS'}  {dt:5.0f} s")
    survivors = [] if ok else ["(no mutant)"]
    for name in args.only or MUTANTS:
        passed, why, dt = run(name, args.examples, args.seeds)
        print(f"{name:34} {'SURVIVED' if passed else 'caught  '}  {dt:5.0f} s  {why}")
        if passed:
            survivors.append(name)
    print(f"{len(args.only or MUTANTS) - len([s for s in survivors if s != '(no mutant)'])} of "
          f"{len(args.only or MUTANTS)} mutants caught")  # fmt: skip
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
