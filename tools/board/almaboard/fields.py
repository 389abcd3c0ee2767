"""The one typed-field checker for configuration, host and board (stdlib only).

Every config reader describes its keys as fields and hands the parsed data to :func:`check`;
nothing reads a config value by hand. A field refuses, with a :class:`ConfigError` naming
``file:line`` of the offending key:

- numbers that are not finite (``nan``, ``inf``: TOML and JSON readers accept them, and a
  NaN compares false with everything, so a threshold of ``nan`` would never trip), out of
  their range, or not numbers at all (``true`` is not a number);
- integers that are floats or booleans (``bool`` is an ``int`` subclass in Python);
- durations (seconds) that are negative, zero where a period must pass, or past their cap;
- strings outside their enum or grammar, lists of the wrong element type;
- keys nobody reads (a typo must not leave a safety limit at its default).

A field returns the value converted (a float for a number, a tuple-free list for a list), so
the caller builds its dataclass from checked values only. Where a key was written comes
from a ``where`` function (``Layers.where`` for TOML layers, :func:`in_file` for a file
whose lines are not known, such as a JSON record).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from .errors import ConfigError

Key = tuple[str, ...]
Where = Callable[[Key], str]

# Larger than any honest value of any field here (bytes, seconds, degrees); a cap that keeps
# arithmetic on the value finite (1e308 * 2 is inf).
HUGE = 1e15


def dotted(key: Key) -> str:
    return ".".join(key)


def in_file(path: object) -> Where:
    """A ``where`` for input without line numbers: every key is at the file."""
    return lambda key: str(path)


class FieldError(ValueError):
    """A value a field refuses; :func:`check` turns it into a ConfigError with file:line."""

    def __init__(self, why: str, hint: str | None = None, *, sub: Key = ()) -> None:
        super().__init__(why)
        self.why, self.hint, self.sub = why, hint, sub  # sub: the key inside a mapping


def _name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list"}.get(
        type(value), "a table" if isinstance(value, dict) else type(value).__name__
    )


class Field:
    """One key's type and range. ``parse`` gets the raw value and returns the checked one.

    Immutable. A plain class rather than a dataclass: ``dataclasses`` imports ``inspect``
    (with ``ast``, ``dis``, ``tokenize``), a fifth of an on-board program's imports, paid at
    every start (alma-ota starts once per update step and per status poll)."""

    __slots__ = ("parse", "describe")
    parse: Callable[[Any], Any]
    describe: str  # "a number in [0, 150]": what the hint says a good value is

    def __init__(self, parse: Callable[[Any], Any], describe: str) -> None:
        object.__setattr__(self, "parse", parse)
        object.__setattr__(self, "describe", describe)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Field is immutable: cannot set {name}")

    def __repr__(self) -> str:
        return f"Field(describe={self.describe!r})"

    def __call__(self, value: Any) -> Any:
        return self.parse(value)


def _real(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(f"must be a number, not {_name(value)} ({value!r})")
    if isinstance(value, int) and abs(value) > HUGE:
        raise FieldError(f"{value} is out of range")
    v = float(value)
    if not math.isfinite(v):
        raise FieldError(f"must be a finite number, not {value!r}")
    return v


def _range_text(lo: float | None, hi: float | None, above: float | None) -> str:
    parts = []
    if above is not None:
        parts.append(f"> {above:g}")
    elif lo is not None:
        parts.append(f">= {lo:g}")
    if hi is not None:
        parts.append(f"<= {hi:g}")
    return " and ".join(parts)


def number(lo: float | None = None, hi: float | None = None, *, above: float | None = None) -> Field:
    """A finite number (int or float, never bool) in ``[lo, hi]`` (``above``: strictly greater)."""
    hi_eff = HUGE if hi is None else hi
    lo_eff = -HUGE if lo is None and above is None else lo
    rng = _range_text(lo_eff if lo is not None else None, hi, above)

    def parse(value: Any) -> float:
        v = _real(value)
        if (above is not None and not v > above) or (lo_eff is not None and v < lo_eff) or v > hi_eff:
            raise FieldError(f"{v:g} is out of range" + (f" (must be {rng})" if rng else ""))
        return v

    return Field(parse, "a number" + (f" {rng}" if rng else ""))


def duration(lo: float = 0.0, hi: float = 7 * 24 * 3600.0, *, above: float | None = None) -> Field:
    """Seconds: a finite number, never negative, at most ``hi`` (a week unless said)."""
    f = number(lo, hi, above=above)
    return Field(f.parse, f"seconds, {_range_text(None if above is not None else lo, hi, above)}")


def integer(lo: int | None = None, hi: int | None = None) -> Field:
    """An integer (not a bool, not a float) in ``[lo, hi]``."""
    rng = _range_text(lo, hi, None)

    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise FieldError(f"must be an integer, not {_name(value)} ({value!r})")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise FieldError(f"{value} is out of range (must be {rng})")
        return value

    return Field(parse, "an integer" + (f" {rng}" if rng else ""))


def boolean() -> Field:
    def parse(value: Any) -> bool:
        if not isinstance(value, bool):
            raise FieldError(f"must be true or false, not {_name(value)} ({value!r})")
        return value

    return Field(parse, "true or false")


def string(pattern: str | None = None, *, max_len: int = 4096, what: str | None = None) -> Field:
    """A string of at most ``max_len`` characters that fully matches ``pattern`` (if given)."""
    rx = re.compile(pattern) if pattern is not None else None
    desc = what or ("a string" if rx is None else f"a string matching {pattern}")

    def parse(value: Any) -> str:
        if not isinstance(value, str):
            raise FieldError(f"must be a string, not {_name(value)} ({value!r})")
        if len(value) > max_len:
            raise FieldError(f"is {len(value)} characters long, over {max_len}")
        if rx is not None and not rx.fullmatch(value):
            raise FieldError(f"{value!r} is not {desc}")
        return value

    return Field(parse, desc)


def enum(*choices: str) -> Field:
    desc = " or ".join(f'"{c}"' for c in choices)

    def parse(value: Any) -> str:
        if not isinstance(value, str) or value not in choices:
            raise FieldError(f"must be {desc}, not {value!r}")
        return value

    return Field(parse, desc)


def optional(inner: Field) -> Field:
    """``inner`` or absent. TOML has no null; JSON's null and Python's None mean "not set"."""
    return Field(lambda v: None if v is None else inner.parse(v), inner.describe)


def list_of(inner: Field, *, max_items: int = 1024) -> Field:
    def parse(value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise FieldError(f"must be a list of {inner.describe}, not {_name(value)} ({value!r})")
        if len(value) > max_items:
            raise FieldError(f"has {len(value)} items, over {max_items}")
        out = []
        for i, item in enumerate(value):
            try:
                out.append(inner.parse(item))
            except FieldError as exc:
                raise FieldError(f"item {i + 1}: {exc.why}", exc.hint) from None
        return out

    return Field(parse, f"a list of {inner.describe}")


Schema = Mapping[str, Field]


def check(
    data: Any,
    schema: Schema,
    where: Where,
    *,
    prefix: Key = (),
    hint: str | None = None,
    allow_unknown: bool = False,
) -> dict[str, Any]:
    """``data`` (a table) checked against ``schema``: the keys present, converted.

    Absent keys are absent from the result (the caller keeps its defaults). An unknown key, a
    non-table ``data`` or a refused value is a :class:`ConfigError` ``"file:line: key: why"``.
    """
    label = f"[{dotted(prefix)}]" if prefix else "the top level"
    if not isinstance(data, dict):
        raise ConfigError(f"{where(prefix)}: {label} must be a table, not {_name(data)}", hint=hint)
    if not allow_unknown:
        unknown = sorted(set(data) - set(schema))
        if unknown:
            raise ConfigError(
                f"{where((*prefix, unknown[0]))}: unknown key(s) in {label}: {', '.join(map(str, unknown))}",
                hint="known keys: " + ", ".join(sorted(schema)),
            )
    out: dict[str, Any] = {}
    for key, field in schema.items():
        if key not in data:
            continue
        out[key] = value(data[key], field, where, (*prefix, key), hint=hint)
    return out


def value(raw: Any, field: Field, where: Where, key: Key, *, hint: str | None = None) -> Any:
    """One value checked; a refusal is a ConfigError naming where ``key`` was written."""
    try:
        return field.parse(raw)
    except FieldError as exc:
        at = (*key, *exc.sub)
        raise ConfigError(
            f"{where(at)}: {dotted(at)}: {exc.why}",
            hint=exc.hint or hint or f"{dotted(key)} is {field.describe}",
        ) from None


def table() -> Field:
    """A table whose keys the caller checks next (:func:`check` with a ``prefix``)."""

    def parse(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise FieldError(f"must be a table, not {_name(value)}")
        return value

    return Field(parse, "a table")


def mapping(keys: Field, values: Field, *, max_items: int = 1024) -> Field:
    """A table of free keys (interface names, zone types) each checked by ``keys``, with
    values checked by ``values``."""

    def parse(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise FieldError(f"must be a table, not {_name(value)}")
        if len(value) > max_items:
            raise FieldError(f"has {len(value)} entries, over {max_items}")
        out = {}
        for k, v in value.items():
            try:
                out[keys.parse(k)] = values.parse(v)
            except FieldError as exc:
                raise FieldError(exc.why, exc.hint, sub=(str(k), *exc.sub)) from None
        return out

    return Field(parse, f"a table of {values.describe}")
