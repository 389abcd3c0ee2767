"""Re-render claimed values from the facts, in place, with jinja2.

Only values that do not hold are rewritten, so a doc that is right stays byte-identical
and an author's chosen precision ("1.6 GB", a kernel version prefix) survives. Inline
markers may name a jinja2 filter (``<!-- fact:bundle_bytes | size("GiB", 2) -->``).
"""

from __future__ import annotations

import json
from decimal import Decimal
from functools import cache
from typing import Any

import yaml

from alma.errors import ConfigError
from alma.gates.claims import Size, format_size, kind_of, parse_size, render_value


def _size_filter(value: Any, unit: str | None = None, decimals: int = 1) -> str:
    """``{{ value | size }}`` (auto unit) or ``{{ value | size("GiB", 2) }}``."""
    if value is None:
        return "unknown"
    like = None
    if unit is not None:
        if parse_size(f"0 {unit}") is None:
            raise ConfigError(f"size filter: unknown unit {unit!r}", hint="use B, kB, MB, GB, KiB, MiB, GiB, ...")
        like = Size(Decimal(0), unit, int(decimals))
    return format_size(int(value), like)


def _yesno(value: Any) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


@cache
def _env() -> Any:
    import jinja2

    env = jinja2.Environment(
        autoescape=False,
        undefined=jinja2.StrictUndefined,
        finalize=lambda v: "unknown" if v is None else v,
        keep_trailing_newline=False,
    )
    env.filters["size"] = _size_filter
    env.filters["yesno"] = _yesno
    env.filters["short"] = lambda v, n=12: "unknown" if v is None else str(v)[:n]
    return env


@cache
def _template(expr: str) -> Any:
    import jinja2

    try:
        return _env().from_string("{{ value | " + expr + " }}")
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"bad filter in fact marker: {expr!r}: {exc.message}") from exc


def inline_text(name: str, fact: Any, previous: Any, filt: str | None, facts: dict[str, Any]) -> str:
    """The text an inline marker shows for ``fact``."""
    import jinja2

    if filt:
        try:
            return str(_template(filt).render(value=fact, facts=facts))
        except jinja2.TemplateError as exc:
            raise ConfigError(f"fact marker filter {filt!r} failed: {exc}") from exc
    if fact is None:
        return "unknown"
    kind = kind_of(name)
    if kind == "bool":
        return _yesno(fact)
    if kind == "size":
        return format_size(int(fact), previous if isinstance(previous, Size) else None)
    if isinstance(fact, dict | list):
        return json.dumps(fact, sort_keys=True)
    return str(_env().from_string("{{ value }}").render(value=fact))


def yaml_text(name: str, fact: Any, previous: Any) -> str:
    """The YAML scalar that states ``fact`` as a front matter claim."""
    value = render_value(name, fact, previous)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Size):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    s = str(value)
    try:
        plain = yaml.safe_load(s) == s and "#" not in s and ": " not in s
    except yaml.YAMLError:
        plain = False
    return s if plain else json.dumps(s)
