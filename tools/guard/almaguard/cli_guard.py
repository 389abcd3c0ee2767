"""``alma-guard``: the thermal guard service and its read-only views.

Exit codes: 0 ok; 1 ``resets`` found the shed threshold above a temperature at which this
board died, or ``status`` found no fresh state; 2 usage or configuration error (with a
"try:" hint); 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from almaboard.errors import run_main
from almaboard.files import boot_id, boottime, read_json, state_age
from almaboard.paths import Paths, from_root

from . import __version__, logsetup
from .config import GuardConfig, load_guard_config
from .errors import GuardError
from .forensics import Forensics, died_below, pending_ending
from .guard import Guard
from .notify import Notifier

STALE_S = 30.0

EPILOG = """commands:
  run         the service loop (default); Type=notify with WatchdogSec under systemd
  status      the state file /run/alma-guard/state.json and whether it is fresh
  resets      how previous boots ended (clean, thermal, watchdog, power-loss, unknown)
  thresholds  zones, trip points and the shed/resume thresholds with their source

exit codes:
  0 ok; 1 resets: the shed threshold is above a temperature at which this board died,
  status: no fresh state (guard not running); 2 usage or configuration error; 130 interrupted
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="alma-guard",
        description="Thermal guard: pauses the work slice before the board's measured reset temperature.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"alma-guard {__version__}")
    p.add_argument("--root", metavar="DIR", help="prefix for every machine path (/sys /proc /dev /run /var/lib /etc)")
    p.add_argument("--config", metavar="FILE", help="config file (default /etc/alma/guard.toml under --root)")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="cmd")
    run = sub.add_parser("run", help="run the guard loop")
    run.add_argument("--polls", type=int, metavar="N", help="stop after N polls (testing)")
    for name in ("status", "resets", "thresholds"):
        sp = sub.add_parser(name)
        sp.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _config(args: argparse.Namespace, paths: Paths) -> GuardConfig:
    path = Path(args.config) if args.config else paths.etc_alma / "guard.toml"
    return load_guard_config(path)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logsetup.setup("alma-guard", args.verbose)
    return run_main("alma-guard", lambda: _dispatch(args))


def _dispatch(args: argparse.Namespace) -> int:
    paths = from_root(args.root)
    cfg = _config(args, paths)
    cmd = args.cmd or "run"
    if cmd == "run":
        return _run(cfg, paths, args.polls)
    if cmd == "status":
        return _status(paths, args.json)
    if cmd == "resets":
        return _resets(cfg, paths, args.json)
    return _thresholds(cfg, paths, args.json)


def _run(cfg: GuardConfig, paths: Paths, polls: int | None) -> int:
    try:
        paths.guard_run.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GuardError(
            f"cannot create {exc.filename}: {exc.strerror}", hint="run as root, or under the alma-guard.service unit"
        ) from exc
    try:
        paths.guard_lib.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        # Guarding matters more than forensics: carry on, Forensics logs each failed write.
        logging.getLogger("alma-guard").error("cannot create %s: %s", exc.filename, exc.strerror)
    _raise_nofile()
    guard = Guard(cfg, paths, notifier=Notifier(), forensics=Forensics(paths, cfg.ring_every_s))
    return guard.run(max_polls=polls)


def _raise_nofile() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: a board with a thousand zones must not run the
    guard out of descriptors (the Reader keeps at most a few hundred; the rest is margin)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _age(state: Any, paths: Paths | None = None) -> float | None:
    """The state's age on CLOCK_BOOTTIME (same boot), never moved by a wall-clock step."""
    if not isinstance(state, dict):
        return None
    boot = boot_id(paths.boot_id_file) if paths is not None else "unknown"
    age = state_age(state, wall=time.time(), boot=boot, now_boottime=boottime())
    return None if age == float("inf") else age


def _status(paths: Paths, as_json: bool) -> int:
    state, source = read_json(paths.guard_state), paths.guard_state
    age = _age(state, paths)
    # The guard writes here instead when /run/alma-guard is not writable (invariant 4).
    fallback = read_json(paths.guard_state_fallback)
    fb_age = _age(fallback, paths)
    if fb_age is not None and (age is None or fb_age < age):
        state, source, age = fallback, paths.guard_state_fallback, fb_age
    fresh = age is not None and age <= STALE_S
    if as_json:
        print(json.dumps({"state": state, "source": str(source), "age_s": age, "fresh": fresh}, indent=1))
    elif not isinstance(state, dict):
        print(f"no guard state at {paths.guard_state}: is alma-guard running? (try: systemctl status alma-guard)")
    else:
        mode = "SHEDDING" if state.get("shedding") else "normal"
        print(f"{mode} since {state.get('since')}: {state.get('reason')}")
        print(
            f"updated {state.get('updated')} ({age:.0f} s ago{'' if fresh else ', STALE'})" if age is not None else ""
        )
        for name, temp in sorted((state.get("zones") or {}).items()):
            print(f"  {name:<16} {temp:6.1f} C")
        for name in state.get("unreadable") or []:
            print(f"  {name:<16} UNREADABLE")
        for err in state.get("errors") or []:
            print(f"  I/O ERROR: {err}")
        if source != paths.guard_state:
            print(f"  (read from {source}: {paths.guard_state} is not being written)")
    return 0 if fresh else 1


def _resets(cfg: GuardConfig, paths: Paths, as_json: bool) -> int:
    now = time.time()
    forensics = Forensics(paths)
    history = forensics.history()
    pending = pending_ending(paths, now)
    guard = Guard(cfg, paths)
    shed = guard.min_shed_c
    died = died_below(history + ([pending] if pending else []), shed) if shed is not None else []
    warnings = [
        f"the board reset at {e.last_max_c:.1f} C ({e.last_zone}, boot {e.boot_id[:8]}), below the shed threshold "
        f"{shed:.1f} C that was supposed to protect it; set measured_reset_c = {e.last_max_c:.1f} in "
        "/etc/alma/guard.d/50-board.toml"
        for e in died
        if shed is not None and e.last_max_c is not None
    ]
    if as_json:
        out: dict[str, Any] = {
            "boots": [e.to_json() for e in history],
            "pending": pending.to_json() if pending else None,
            "shed_c": shed,
            "warnings": warnings,
        }
        print(json.dumps(out, indent=1))
    else:
        rows = history + ([pending] if pending else [])
        if not rows:
            print("no previous boot recorded yet")
        for e in rows:
            tag = " (not yet recorded: the guard has not started this boot)" if e is pending else ""
            temp = f"{e.last_max_c:.1f} C" if isinstance(e.last_max_c, (int, float)) else "-"
            print(
                f"boot {e.boot_id[:8]} ended {e.ended.upper():<10} last max {temp:<8} at {e.last_sample_at or '-'}{tag}"
            )
            for ev in e.evidence:
                print(f"    evidence: {ev}")
        for w in warnings:
            print(f"WARNING: {w}", file=sys.stderr)
    return 1 if warnings else 0


def _thresholds(cfg: GuardConfig, paths: Paths, as_json: bool) -> int:
    guard = Guard(cfg, paths)
    rows: list[dict[str, Any]] = []
    for z in guard.zones:
        th = guard.thresholds[z.name]
        rows.append(
            {
                "zone": z.name,
                "path": str(z.path),
                "trips": [{"type": t.kind, "temp_c": t.temp_c} for t in z.trips],
                "shed_c": th.shed_c,
                "resume_c": th.resume_c,
                "source": th.source,
            }
        )
    if as_json:
        print(json.dumps({"slice": cfg.slice, "cgroup": str(guard.cgroup), "zones": rows}, indent=1))
        return 0
    print(f"work slice {cfg.slice} -> {guard.cgroup}; hold-off {cfg.holdoff_s:.0f} s; poll {cfg.interval_s:g} s")
    if not rows:
        print("no thermal zones found: the guard would shed at once (fail closed)")
    for r in rows:
        trips = ", ".join(f"{t['type']} {t['temp_c']:.1f}" for t in r["trips"]) or "no trips"
        print(f"  {r['zone']:<16} shed {r['shed_c']:5.1f} C  resume {r['resume_c']:5.1f} C  ({r['source']}; {trips})")
    return 0
