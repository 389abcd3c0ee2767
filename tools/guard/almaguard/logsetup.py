"""Logging to stderr; under systemd each line carries an sd-daemon ``<N>`` priority prefix
so journald files warnings as warnings (systemd's SyslogLevelPrefix=yes default)."""

from __future__ import annotations

import logging
import os
import sys

_PRIO = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


class _JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"<{_PRIO.get(record.levelno, 6)}>{record.getMessage()}"


def setup(name: str, verbose: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM"):
        handler.setFormatter(_JournalFormatter())
    else:
        handler.setFormatter(logging.Formatter(f"{name}: %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
