"""Progress-parsing overhead: a recorded 500,000-line bitbake log piped through alma's parser vs `cat`.

Both sides read the log through a pipe (from `cat LOG`) and write a copy of it to a file,
as `alma build` keeps the full log; the parser also parses every line for progress and the
summary. Runs interleaved, best-of and median printed. Target: ratio <= 1.3.

    .venv/bin/python bench/bench_progress.py [--lines 500000] [--runs 7]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 1.3
COPY = "import shutil, sys; shutil.copyfileobj(sys.stdin.buffer, open(sys.argv[1], 'wb'), 4 << 20)"
OE = "/srv/build/layers/openembedded-core/meta"
RECIPES = [
    (f"{OE}/recipes-core/busybox/busybox_1.36.1.bb", "busybox-1.36.1-r0"),
    (f"{OE}/recipes-core/glibc/glibc_2.39.bb", "glibc-2.39+git-r0"),
    (f"{OE}/recipes-devtools/gcc/gcc-cross_13.3.bb", "gcc-cross-aarch64-13.3.0-r0"),
    (
        "/srv/build/layers/meta-tegra/recipes-kernel/linux/linux-jammy-nvidia-tegra_5.15.bb",
        "linux-jammy-nvidia-tegra-5.15.185+git-r0",
    ),
    (f"{OE}/recipes-core/systemd/systemd_255.21.bb", "systemd-255.21-r0"),
]
TASKS = [
    "do_fetch",
    "do_unpack",
    "do_patch",
    "do_configure",
    "do_compile",
    "do_install",
    "do_package",
    "do_packagedata",
    "do_package_write_ipk",
    "do_populate_sysroot",
]


def make_log(path: Path, n_lines: int) -> None:
    """A realistic knotty log: parse banner, sstate summary, setscene, tasks with their
    Started/Succeeded notes, warnings, one failure with its log excerpt, the summaries."""
    rnd = random.Random(4242)
    lines = [
        "Loading cache...done.",
        "Loaded 4120 entries from dependency cache.",
        "Parsing recipes...done.",
        "Parsing of 2174 .bb files complete (2100 cached, 74 parsed). 3532 targets, 212 skipped, 0 masked, 0 errors.",
        "NOTE: Resolving any missing task queue dependencies",
        "",
        "Build Configuration:",
        'BB_VERSION           = "2.8.0"',
        'MACHINE              = "jetson-orin-nano-devkit"',
        "Initialising tasks...done.",
        "Sstate summary: Wanted 21000 Local 15200 Mirrors 1300 Missed 4500 Current 9000 (78% match, 85% complete)",
        "NOTE: Executing Tasks",
    ]
    setscene = n_lines // 20
    total = n_lines // 3
    for n in range(1, setscene + 1):
        fn, pf = rnd.choice(RECIPES)
        lines.append(f"NOTE: Running setscene task {n} of {setscene} ({fn}:do_populate_sysroot_setscene)")
    n = 0
    while len(lines) < n_lines - 12:
        n += 1
        fn, pf = rnd.choice(RECIPES)
        task = rnd.choice(TASKS)
        lines.append(f"NOTE: Running task {n} of {total} ({fn}:{task})")
        lines.append(f"NOTE: recipe {pf}: task {task}: Started")
        r = rnd.random()
        if r < 0.02:
            lines.append(
                f"WARNING: {pf} {task}: QA Issue: File /usr/lib/libx.so.1 in package {pf} doesn't have GNU_HASH"
            )
        elif r < 0.03:
            lines += [f"| make[2]: Entering directory '/srv/build/tmp/work/{pf}/build'"] * 3
        lines.append(f"NOTE: recipe {pf}: task {task}: Succeeded")
    fn, pf = RECIPES[0]
    log = "/srv/build/tmp/work/cortexa78ae-alma-linux/busybox/1.36.1/temp/log.do_compile.4242"
    lines += [
        f"ERROR: {pf} do_compile: oe_runmake failed",
        f"ERROR: Logfile of failure stored in: {log}",
        "Log data follows:",
        "| ERROR: oe_runmake failed",
        f"ERROR: Task ({fn}:do_compile) failed with exit code '1'",
        f"NOTE: Tasks Summary: Attempted {n} tasks of which {setscene} didn't need to be rerun and 1 failed.",
        "",
        "Summary: 1 task failed:",
        f"  {fn}:do_compile",
        f"    log: {log}",
        "Summary: There were 2 ERROR messages, returning a non-zero exit code.",
    ]
    path.write_text("\n".join(lines[:n_lines]) + "\n")


def pipeline(log: Path, consumer: list[str], out: Path) -> float:
    t0 = time.perf_counter()
    prod = subprocess.Popen(["cat", str(log)], stdout=subprocess.PIPE)
    cons = subprocess.Popen(
        consumer,
        stdin=prod.stdout,
        stderr=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL if consumer[0] != "cat" else out.open("wb"),
    )
    assert prod.stdout is not None
    prod.stdout.close()
    cons.wait()
    prod.wait()
    if cons.returncode != 0:
        raise SystemExit(f"{consumer} failed with {cons.returncode}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=500_000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "bitbake.log"
        make_log(log, args.lines)
        size = log.stat().st_size
        out = Path(tmp) / "copy.log"
        parser = [sys.executable, "-m", "alma.imagebuild.progress", str(out)]
        per_line = [sys.executable, "-m", "alma.imagebuild.progress", "--per-line", str(out)]
        # check the parser really parsed the log (not a no-op)
        res = subprocess.run(parser, stdin=log.open("rb"), capture_output=True, text=True, check=True)
        assert '"tasks_attempted"' in res.stderr and out.read_bytes() == log.read_bytes(), res.stderr
        # the floor of any Python consumer: start the interpreter, copy the pipe to the file
        py_copy = [sys.executable, "-c", COPY, str(out)]
        times: dict[str, list[float]] = {"cat": [], "alma": [], "alma-per-line": [], "python-copy": []}
        for _ in range(args.runs):  # interleaved so drift hits all sides alike
            times["cat"].append(pipeline(log, ["cat"], out))
            times["alma"].append(pipeline(log, parser, out))
            times["alma-per-line"].append(pipeline(log, per_line, out))
            times["python-copy"].append(pipeline(log, py_copy, out))
    print(f"log: {args.lines} lines, {size / 1e6:.1f} MB; {args.runs} runs each, interleaved")
    for name, ts in times.items():
        print(f"  {name:<14} best {min(ts) * 1000:7.1f} ms   median {statistics.median(ts) * 1000:7.1f} ms")
    ratio = statistics.median(times["alma"]) / statistics.median(times["cat"])
    ratio_line = statistics.median(times["alma-per-line"]) / statistics.median(times["cat"])
    print(
        f"ratio alma (block scan, python -m alma.imagebuild.progress) / cat: {ratio:.2f}  (target <= {TARGET}) "
        f"{'MET' if ratio <= TARGET else 'NOT MET'}"
    )
    floor = statistics.median(times["alma"]) / statistics.median(times["python-copy"])
    print(f"ratio alma per-line feed (as alma build's runner callback) / cat: {ratio_line:.2f}  (informative)")
    print(f"ratio alma / plain python copy (the parsing cost alone): {floor:.2f}  (informative)")


if __name__ == "__main__":
    main()
