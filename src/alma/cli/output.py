"""Output helpers shared by the verbs: rich on a terminal, plain lines otherwise, JSON for scripts."""

from __future__ import annotations

import json
import sys
from typing import Any

import click


def is_tty() -> bool:
    return sys.stdout.isatty()


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def console(stderr: bool = False) -> Any:
    """A rich Console (imported lazily: rich costs start-up time)."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)
