"""``alma-health``: one run of the alert-only health checks.

Prints one Nagios-style status line with perfdata (then one line per check), or the JSON
report of docs/formats.md with ``--json``. Exit code: 0 OK, 1 WARNING, 2 CRITICAL,
3 UNKNOWN (the worst check, ordered OK < UNKNOWN < WARNING < CRITICAL); a usage or
configuration error is UNKNOWN (3) too, as monitoring plugins do.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from almaboard import text
from almaboard.errors import BoardError
from almaboard.files import iso
from almaboard.nagios import CODES, UNKNOWN, status_line
from almaboard.paths import from_root

from . import __version__
from .health import CHECK_NAMES, Context, hostname, load_health_config, report, run_checks

EPILOG = f"""checks: {", ".join(CHECK_NAMES)}

exit codes (Nagios): 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN; the worst check wins with
the ordering OK < UNKNOWN < WARNING < CRITICAL. Usage and configuration errors
(unknown options included) exit 3 UNKNOWN, with the error on stderr (and the
UNKNOWN line on stdout, where a monitoring system reads it).
It takes no action: it reports.
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"alma-health: error: {message}", file=sys.stderr)
        sys.exit(CODES[UNKNOWN])


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="alma-health",
        description="Health watchdog for ALMA-OS boards (alert-only).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"alma-health {__version__}")
    p.add_argument("--json", action="store_true", help="print the JSON report (docs/formats.md) instead of the line")
    p.add_argument("--root", metavar="DIR", help="prefix for every machine path (/sys /proc /dev /run /var/lib /etc)")
    p.add_argument("--config", metavar="FILE", help="config file (default /etc/alma/health.toml under --root)")
    p.add_argument("--check", action="append", choices=CHECK_NAMES, help="run only this check (repeatable)")
    p.add_argument("--no-save", action="store_true", help="do not update the saved counters and kernel-log cursor")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        paths = from_root(args.root)
        cfg = load_health_config(Path(args.config) if args.config else paths.etc_alma / "health.toml")
        now = time.time()
        ctx = Context(paths=paths, cfg=cfg, now=now, save=not args.no_save)
        checks = run_checks(ctx, args.check)
        rep = report(checks, hostname(paths), now)
    except BoardError as exc:
        msg = exc.message + (f" (try: {exc.hint})" if exc.hint else "")
        print(f"alma-health: error: {text.terminal(msg)}", file=sys.stderr)
        if args.json:
            err = {"schema": "alma.health/1", "node": None, "time": iso(), "status": UNKNOWN, "code": 3}
            print(text.dumps({**err, "error": msg, "checks": []}))
        else:
            print(f"ALMA-HEALTH UNKNOWN - {text.nagios_text(msg)}")
        return CODES[UNKNOWN]
    except KeyboardInterrupt:
        return 130
    try:
        if args.json:
            print(text.dumps(rep, indent=1))  # strict JSON: a NaN reading is null
        else:
            print(status_line(checks))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`alma-health | head -1`): the verdict still stands.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return int(rep["code"])
