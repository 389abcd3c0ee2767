"""Benchmark: `alma fleet health` over 16 loopback nodes vs a sequential ssh loop.

Both sides talk to the same REAL sshd (Debian openssh-server on 127.0.0.1, MaxStartups
raised to 64:30:128 because the default 10:30:100 starts dropping connections beyond 10
unauthenticated at once) and run the same REAL on-board `alma-health --json`, each node on
its own fake board tree. The anchor is what an operator does without the tool:
`for n in nodes; do ssh n alma-health --json; done`.

Targets: parallel <= 0.3x the sequential loop (with the bounds of issue 12: the 1 MiB
output cap, the remote command under its own `timeout`), and <= 1.5x the slowest node.
On loopback every "node" shares this machine's cores, so the bench also prints the CPU
floor (CPU seconds the 16 ssh+sshd+alma-health runs need / cores): no parallel run can beat
it here, while on a real fleet each node's share runs on that node. A third figure shows
the tool with `[ssh] control_persist` (one reused connection per node, as Ansible does).
The flood case: one node whose health command is `head -c 3000000000 /dev/zero` with
`timeout = 5`, against one healthy node: wall time and peak RSS of `alma fleet health` (each
in a fresh interpreter, so the RSS is that run's own). Before issue 12 a 200 MB flood took
257 s at 586 MB; 3 GB ran past 600 s at 3.3 GB.
Run: .venv/bin/python bench/bench_fleet.py [--nodes 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
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

from support_fleet import HEALTH, start_sshd, stop_sshd  # noqa: E402
from support_guard import FakeBoard, orin_zones  # noqa: E402

from alma.fleet.health import run_fleet_health  # noqa: E402
from alma.fleet.inventory import load_fleet  # noqa: E402
from alma.fleet.ssh import control_dir, ssh_argv  # noqa: E402


def sshd_cpu(pid: int) -> float:
    """CPU seconds of sshd and its reaped children (the per-connection sshds and commands)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def make_board(root: Path) -> FakeBoard:
    b = FakeBoard(root)
    orin_zones(b, 55.0)
    b.add_iface("eth1", carrier=1, speed=10000)
    b.set_meminfo(total_kb=32_000_000, avail_kb=20_000_000)
    b.set_psi(0.0, 0.0)
    b.add_watchdog()
    b.write_guard_state(shedding=False)
    # The disk check reads the real filesystem under the tree: do not let the host's
    # free space decide a node's colour.
    b.write_config("health.toml", "[disk]\nwarn_pct = 0.0\ncrit_pct = 0.0\n")
    return b


FLOOD_RUN = """
import json, resource, sys, time
from alma.fleet.health import run_fleet_health
from alma.fleet.inventory import load_fleet
fleet = load_fleet(__import__("pathlib").Path(sys.argv[1]))
t0 = time.perf_counter()
rep = run_fleet_health(fleet)
print(json.dumps({"wall": time.perf_counter() - t0, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "status": rep.nodes[0].status.name, "summary": rep.nodes[0].summary}))
"""


def flood_case(base: Path, ssh_config: Path, healthy_cmd: str) -> dict[str, dict[str, float | str]]:
    """Wall time and peak RSS of one fleet run: a 3 GB flood node vs a healthy one."""
    out = {}
    for name, cmd in (("healthy", healthy_cmd), ("flood", "head -c 3000000000 /dev/zero")):
        f = base / f"fleet-{name}.toml"
        f.write_text(f'[ssh]\nconfig = "{ssh_config}"\n[health]\ntimeout = 5\n'
                     f'[[node]]\nname = "bench-{name}"\nrole = "cluster"\nhealth_command = "{cmd}"\n')  # fmt: skip
        r = subprocess.run([sys.executable, "-c", FLOOD_RUN, str(f)], capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise SystemExit(f"flood case {name} failed: {r.stderr[-2000:]}")
        out[name] = json.loads(r.stdout)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not HEALTH.exists():
        print(f"missing {HEALTH}", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        base = Path(tmp)
        sshd = start_sshd(base / "sshd")
        try:
            body = f'[ssh]\nconfig = "{sshd.client_config}"\n[health]\ntimeout = 60\n'
            boards = []
            for i in range(args.nodes):
                root = base / f"node{i:02d}"
                boards.append(make_board(root))
                cmd = f"python3 {HEALTH} --root {root} --json --no-save"
                body += f'\n[[node]]\nname = "bench-{i:02d}"\nrole = "cluster"\nhealth_command = "{cmd}"\n'
            (base / "fleet.toml").write_text(body)
            fleet = load_fleet(base / "fleet.toml")
            mux_file = base / "fleet-mux.toml"
            mux_file.write_text(
                body.replace("[health]", f'control_persist = 60\ncontrol_dir = "{base / "cm"}"\n[health]')
            )
            mux = load_fleet(mux_file)

            # Warm-up (page cache; for `mux`, opens the persistent connections): not measured.
            run_fleet_health(fleet)
            run_fleet_health(mux)

            seq_totals, slowest, par_totals, mux_totals, floors, own = [], [], [], [], [], []
            for _ in range(args.rounds):
                for b in boards:  # a live guard rewrites its state every 10 s; keep it fresh
                    b.write_guard_state(shedding=False)
                per_node = []
                t0 = time.perf_counter()
                for node in fleet.nodes:
                    t = time.perf_counter()
                    r = subprocess.run(ssh_argv(node, node.health_command, fleet.ssh), capture_output=True)
                    per_node.append(time.perf_counter() - t)
                    if r.returncode not in (0, 1, 2, 3):
                        raise SystemExit(f"sequential ssh to {node.name} failed: {r.stderr.decode()}")
                seq_totals.append(time.perf_counter() - t0)
                slowest.append(max(per_node))

                for b in boards:
                    b.write_guard_state(shedding=False)
                c0, s0, o0 = children_cpu(), sshd_cpu(sshd.proc.pid), self_cpu()
                t0 = time.perf_counter()
                rep = run_fleet_health(fleet)
                par_totals.append(time.perf_counter() - t0)
                own.append(self_cpu() - o0)
                used = children_cpu() - c0 + sshd_cpu(sshd.proc.pid) - s0 + own[-1]
                floors.append(used / (os.cpu_count() or 1))
                t0 = time.perf_counter()
                rep_mux = run_fleet_health(mux)
                mux_totals.append(time.perf_counter() - t0)
                for r in (rep, rep_mux):
                    bad = [n.name for n in r.nodes if not n.reachable or not n.checks]
                    if bad:
                        raise SystemExit(f"parallel run lost nodes {bad}: {[n.summary for n in r.nodes][:2]}")
            boards[0].write_guard_state(shedding=False)
            flood = flood_case(base, sshd.client_config, fleet.nodes[0].health_command)
        finally:
            for node in mux.nodes if "mux" in locals() else ():
                subprocess.run([*ssh_argv(node, "", mux.ssh)[:-3], "-O", "exit", node.ssh], capture_output=True)
            stop_sshd(sshd)
            assert not any(control_dir(mux.ssh).iterdir()) if "mux" in locals() else True

    seq, par, slow = statistics.median(seq_totals), statistics.median(par_totals), statistics.median(slowest)
    floor, par_mux = statistics.median(floors), statistics.median(mux_totals)
    r_seq, r_slow = par / seq, par / slow
    print(f"fleet health over {args.nodes} loopback nodes (real sshd, real alma-health), median of {args.rounds}:")
    print(f"  sequential ssh loop (anchor): {seq:7.3f} s")
    print(f"  slowest single node:          {slow:7.3f} s")
    print(f"  CPU floor here ({os.cpu_count()} cores):    {floor:7.3f} s  (CPU of ssh+sshd+alma-health+tool / cores)")
    print(f"  alma fleet health (parallel): {par:7.3f} s  ({par / floor:.2f}x the CPU floor; "
          f"the tool itself used {statistics.median(own):.3f} CPU-s)")  # fmt: skip
    print(f"  ... with control_persist:     {par_mux:7.3f} s  ({par_mux / seq:.3f}x sequential, "
          f"{par_mux / slow:.3f}x slowest node)")  # fmt: skip
    print(f"  ratio parallel/sequential:    {r_seq:7.3f}x  (target <= 0.3x)  {'MET' if r_seq <= 0.3 else 'NOT MET'}")
    print(f"  ratio parallel/slowest node:  {r_slow:7.3f}x  (target <= 1.5x)  {'MET' if r_slow <= 1.5 else 'NOT MET'}")
    h, fl = flood["healthy"], flood["flood"]
    print("flood case, timeout = 5 s (one fleet run in a fresh interpreter each):")
    print(f"  healthy node:        {float(h['wall']):6.2f} s wall, {float(h['rss_mb']):6.1f} MB peak RSS  "
          f"({h['status']})")  # fmt: skip
    print(f"  3 GB flood node:     {float(fl['wall']):6.2f} s wall, {float(fl['rss_mb']):6.1f} MB peak RSS  "
          f"({fl['status']}: {fl['summary']})")  # fmt: skip
    print(f"  ratio flood/healthy: {float(fl['wall']) / float(h['wall']):6.2f}x wall, "
          f"{float(fl['rss_mb']) / float(h['rss_mb']):6.2f}x RSS  (target: wall < 6 s, RSS < 100 MB) "
          f"{'MET' if float(fl['wall']) < 6 and float(fl['rss_mb']) < 100 else 'NOT MET'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
