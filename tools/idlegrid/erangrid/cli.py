"""``eran-grid``: run the agent, say why it is (not) running, administer the queue.

Exit codes: 0 success (``status``: working or ready to), 1 ``status``: not working (the line
says why) or ``results``: the job has no result yet, 2 usage or configuration error (including
"disabled: opt-in required" for ``run``, and a corrupt queue file: see ``queue repair``), 3 privacy
refusal (a capture device is open),
4 coordinator unreachable, or the queue is not this user's to open (its files are the agent's; the
message says what to run instead), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from almaboard.errors import run_main
from almaboard.text import terminal

from . import __version__, power, presence, privacy, thermal
from .agent import STATUS_REFRESH, Agent, Conditions, blocking_reason, iso
from .config import DEFAULT_CONFIG, Config, from_mapping, load
from .errors import CoordinatorUnreachable, NoAccess, UserError
from .jobs import Backend, validate_command

EPILOG = __doc__.split("\n\n", 1)[1] if __doc__ else ""


def _config(args: argparse.Namespace) -> tuple[Config, str]:
    root = Path(args.root) if args.root else None
    if args.config is None and not DEFAULT_CONFIG.exists():
        cfg = from_mapping({}, "defaults", root=root)  # admin verbs work without a config file
        source = str(DEFAULT_CONFIG)
    else:
        path = Path(args.config) if args.config else DEFAULT_CONFIG
        cfg, source = load(path, root=root), str(path)
    if getattr(args, "queue_path", None):
        import dataclasses

        cfg = dataclasses.replace(
            cfg, queue=dataclasses.replace(cfg.queue, backend="sqlite", path=Path(args.queue_path))
        )
    return cfg, source


def open_backend(cfg: Config) -> Any:
    if cfg.queue.backend == "nats":
        from . import credentials
        from .nats_queue import NatsQueue  # optional dependency: imported only when configured

        return NatsQueue(
            cfg.queue.url,
            cfg.queue.stream,
            max_failures=cfg.max_failures,
            lease_ttl=cfg.lease_ttl,
            connect_timeout=cfg.queue.connect_timeout,
            credentials=credentials.load(cfg.queue.credentials),
        )
    from .sqlite_queue import SqliteQueue

    return SqliteQueue(cfg.queue.path, max_failures=cfg.max_failures, lease_ttl=cfg.lease_ttl)


def _log(line: str) -> None:
    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    print(f"{stamp} {line}", file=sys.stderr, flush=True)


# -- run --------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    cfg, source = _config(args)
    cfg.require_opt_in(source)
    backend: Backend = open_backend(cfg)
    stop = {"flag": False}

    def _stop(signum: int, _frame: object) -> None:
        stop["flag"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    agent = Agent(cfg, backend, log=_log)
    _log(
        f"eran-grid {__version__} on {cfg.node}: {cfg.queue.backend} queue, poll {cfg.poll} s, "
        f"idle after {cfg.idle_after:.0f} s"
    )
    steps = {"n": 0}

    def should_stop() -> bool:
        steps["n"] += 1
        return stop["flag"] or (args.steps is not None and steps["n"] > args.steps)

    agent.run(should_stop)
    return 0


# -- status -----------------------------------------------------------------------------------
def _boot_id(proc: Path) -> str:
    from almaboard.files import boot_id

    return boot_id(proc / "sys/kernel/random/boot_id")


def live_line(cfg: Config) -> tuple[str, bool]:
    """Evaluate the conditions once, without the agent (it is not running)."""
    m = cfg.machine
    now = time.time()
    readings = thermal.ZoneWatch(m.thermal, cfg.plausibility).read(time.monotonic())
    heat = thermal.zone_heat(readings, cfg.max_temp_c, cfg.zone_max_c)
    if not heat.hot:
        heat = thermal.guard_heat(m.guard_state, cfg.guard_stale_after, cfg.require_guard, now, boot=_boot_id(m.proc))
    tty = presence.tty_activity(presence.terminals(m.dev, m.dev_pts, cfg.include_serial_ttys))
    sess = presence.session_activity(m.sessions, now)
    act = max(
        (a for a in (tty, sess) if a.at is not None), key=lambda a: a.at or 0.0, default=presence.Activity(None, "")
    )
    cond = Conditions(power.on_ac(m.power_supply), heat, act, now)
    reason = blocking_reason(cfg, cond)
    if not reason:
        try:
            backend = open_backend(cfg)
            backend.ping()
            backend.close()
        except CoordinatorUnreachable as exc:
            reason = f"coordinator unreachable since {iso(now)}: {exc}"
        except NoAccess:
            reason = "the queue is the agent's: run `sudo eran-grid status` to check it"
    return reason, not reason


def cmd_status(args: argparse.Namespace) -> int:
    cfg, source = _config(args)
    info: dict[str, Any] = {"node": cfg.node, "enabled": cfg.enabled}
    if not cfg.enabled:
        line, working = "disabled: opt-in required", False
    else:
        privacy.assert_empty_sensor_set()
        status = None
        with contextlib.suppress(OSError, ValueError):
            status = json.loads(cfg.status_path.read_text())
        fresh = (
            status is not None
            and time.time() - float(status.get("updated", 0)) <= 5 * STATUS_REFRESH
            and os.path.exists(f"/proc/{int(status.get('pid', 0))}")  # a dead agent's file is no status
        )
        if fresh and status is not None:
            line, working = str(status["line"]), bool(status.get("working"))
            info["agent"] = status
        else:
            reason, ready = live_line(cfg)
            line = f"agent not running; {reason}" if reason else "agent not running; ready to work"
            working = False
            info["ready"] = ready
    info["line"] = line
    info["working"] = working
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
    else:
        print(terminal(line))
    return 0 if working or line.endswith("ready to work") or line.startswith(("idle", "running")) else 1


# -- submit / results / queue -----------------------------------------------------------------
def cmd_submit(args: argparse.Namespace) -> int:
    cfg, _ = _config(args)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    validate_command(command)
    data = b""
    if args.input == "-":
        data = sys.stdin.buffer.read()
    elif args.input:
        try:
            data = Path(args.input).read_bytes()
        except OSError as exc:
            raise UserError(f"cannot read input {args.input}: {exc.strerror}") from None
    backend = open_backend(cfg)
    ids = [
        backend.submit(command, data, name=args.name or "", checkpoint=not args.no_checkpoint, priority=args.priority)
        for _ in range(args.count)
    ]
    backend.close()
    if args.json:
        print(json.dumps({"ids": ids}))
    else:
        print("\n".join(ids))
    return 0


def cmd_results(args: argparse.Namespace) -> int:
    cfg, _ = _config(args)
    backend = open_backend(cfg)
    try:
        if args.job:
            state, result, exit_code, detail = backend.result(args.job)
            if args.json:
                print(
                    json.dumps(
                        {
                            "id": args.job,
                            "state": state,
                            "exit_code": exit_code,
                            "detail": detail,
                            "result": (result or b"").decode(errors="replace"),
                        }
                    )
                )
            elif state in ("done", "dead"):
                if state == "dead":
                    print(f"job {args.job} dead-lettered: {detail}", file=sys.stderr)
                sys.stdout.buffer.write(result or b"")
                sys.stdout.flush()
            else:
                print(f"job {args.job} is {state}: no result yet", file=sys.stderr)
            return 0 if state == "done" else 1
        rows = backend.jobs(("done", "dead"))
        _print_rows(rows, args.json)
        return 0
    finally:
        backend.close()


def _print_rows(rows: list[dict[str, Any]], as_json: bool) -> None:
    """Rows hold job-controlled text (names, commands, stderr tails): a terminal sees them only
    through the one sanitizer (almaboard.text), JSON only as JSON strings."""
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    print(f"{'ID':>6}  {'STATE':7} {'YIELDS':>6} {'FAILS':>5}  {'NAME/COMMAND':40}  DETAIL")
    for r in rows:
        what = terminal(str(r.get("name") or " ".join(r["command"])))
        job_id, state, detail = terminal(str(r["id"])), terminal(str(r["state"])), terminal(str(r["detail"]))
        print(f"{job_id[:64]:>6}  {state:7} {r['yields']:>6} {r['failures']:>5}  {what[:40]:40}  {detail[:60]}")


def cmd_queue(args: argparse.Namespace) -> int:
    cfg, _ = _config(args)
    if args.action == "repair":
        return _repair(cfg)
    backend = open_backend(cfg)
    try:
        if args.action == "list":
            states = tuple(args.state) if args.state else ("queued", "leased", "done", "dead")
            _print_rows(backend.jobs(states), args.json)
        elif args.action == "stats":
            counts = backend.counts()
            print(json.dumps(counts) if args.json else "  ".join(f"{k} {v}" for k, v in counts.items()))
        elif args.action == "requeue":
            backend.requeue(args.job)
            print(f"job {args.job} requeued")
        elif args.action == "remove":
            backend.remove(args.job)
            print(f"job {args.job} removed")
        return 0
    finally:
        backend.close()


def _repair(cfg: Config) -> int:
    """Move a corrupt SQLite queue aside (explicitly: the agent never does it on its own)."""
    if cfg.queue.backend != "sqlite":
        raise UserError("queue repair is for the SQLite queue", hint="a NATS queue is repaired on its server")
    from .sqlite_queue import repair

    path = cfg.queue.path
    if not path.exists():
        raise UserError(f"no queue at {path}", hint="nothing to repair; the agent creates it at start")
    moved = repair(path, datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))
    if moved is None:
        print(f"{path}: integrity check ok; nothing moved")
    else:
        print(f"{path} was corrupt: moved to {moved}; a new, empty queue is created at the next start")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eran-grid",
        description="ERAN-GRID: opt-in idle-cycle agent.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"eran-grid {__version__}")
    p.add_argument("--config", help=f"configuration file (default {DEFAULT_CONFIG})")
    p.add_argument("--root", help="prefix for every machine path (/sys, /dev, /proc, /run): a fake tree for tests")
    sub = p.add_subparsers(dest="verb", required=True)

    def add(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name, help=help, description=help, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
        )

    r = add("run", "run the agent (refuses unless the configuration says enabled = true)")
    r.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    r.set_defaults(func=cmd_run)
    s = add("status", "say in one line why the agent is or is not working")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)

    def queue_opts(a: argparse.ArgumentParser) -> None:
        a.add_argument("--queue-path", help="SQLite queue file (overrides the configuration)")
        a.add_argument("--json", action="store_true")

    a = add("submit", "add a job: a command, its input, optionally a checkpoint dir")
    queue_opts(a)
    a.add_argument("--name")
    a.add_argument("--input", help="file whose bytes are the job's stdin ('-' = our stdin)")
    a.add_argument("--no-checkpoint", action="store_true", help="no checkpoint directory for this job")
    a.add_argument("--priority", type=int, default=0)
    a.add_argument("--count", type=int, default=1, help="submit N copies")
    a.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    a.set_defaults(func=cmd_submit)

    a = add("results", "list finished jobs, or print one job's result")
    queue_opts(a)
    a.add_argument("job", nargs="?")
    a.set_defaults(func=cmd_results)

    a = add("queue", "administer the queue: list, stats, requeue (dead), remove, repair")
    qsub = a.add_subparsers(dest="action", required=True)
    for action, hlp in (
        ("list", "list jobs"),
        ("stats", "count jobs by state"),
        ("requeue", "put a dead-lettered job back in the queue"),
        ("remove", "delete a job that is not running"),
        ("repair", "move a corrupt SQLite queue aside to queue.db.corrupt-<stamp>"),
    ):
        q = qsub.add_parser(
            action, help=hlp, description=hlp, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        queue_opts(q)
        if action in ("requeue", "remove"):
            q.add_argument("job")
        if action == "list":
            q.add_argument("--state", action="append", choices=("queued", "leased", "done", "dead"))
        q.set_defaults(func=cmd_queue)
    return p


def _as_this_user(func: Any, args: argparse.Namespace) -> int:
    """The admin verbs, run by any user: a file the agent keeps private (DynamicUser=: its state
    under /var/lib/private/, 0700) is a clear refusal with what to run instead, never a
    traceback. ``run`` is the agent's own: there a PermissionError stays a bug."""
    try:
        return int(func(args))
    except PermissionError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        raise NoAccess(
            f"permission denied{where}: the agent's files are private to it",
            hint=f"run the same command as root (sudo eran-grid {args.verb} ...)",
        ) from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.func is cmd_run:
        return run_main("eran-grid", lambda: int(args.func(args)))
    return run_main("eran-grid", lambda: _as_this_user(args.func, args))
