"""Output helpers shared by the verbs: rich on a terminal, plain lines otherwise, JSON for scripts."""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

import click


def color() -> bool:
    """Whether output may be coloured: not under NO_COLOR (https://no-color.org: any non-empty
    value) nor ``alma --no-color`` (which sets NO_COLOR, so rich and child tools obey too)."""
    return not os.environ.get("NO_COLOR")


def secho(message: str, *, fg: str | None = None, err: bool = False) -> None:
    """click.secho that honours NO_COLOR / --no-color (click itself strips colour only off a terminal)."""
    if fg and color():
        click.secho(message, fg=fg, err=err)
    else:  # secho adds a reset sequence even without a colour
        click.echo(message, err=err)


def is_tty() -> bool:
    return sys.stdout.isatty()


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def console(stderr: bool = False) -> Any:
    """A rich Console (imported lazily: rich costs start-up time)."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def finite(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """click's FloatRange lets ``inf`` and ``nan`` through (every comparison with nan is
    false): a deadline, a temperature, a CPU budget must be a number."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value!r} is not a finite number")
    return value
