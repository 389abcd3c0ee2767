"""What a claim means and when it holds: one kind per known fact name.

A claim *holds* when the fact backs it, is *stale* when the fact contradicts it, and is
*unbacked* when the doc asserts something but the manifest does not know (value null):
a doc never states what the manifest cannot back. ``null`` as a claim means "unknown"
and holds only while the fact is unknown too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from alma.artefacts.manifest import FACT_KINDS, LABELS
from alma.artefacts.rootfs import COMPONENTS
from alma.errors import ConfigError

HOLDS, STALE, UNBACKED = "holds", "stale", "unbacked"

KINDS = FACT_KINDS  # one claim kind per fact, defined with the manifest
COMPONENT_PREFIX = "components."

# Decimal units as printed by humans and `du --si`; binary ones as `ls -lh` prints (1.6G).
UNITS: dict[str, int] = {
    "B": 1,
    "kB": 10**3,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
    "K": 2**10,
    "M": 2**20,
    "G": 2**30,
    "T": 2**40,
}
_SIZE = re.compile(r"^\s*~?\s*(\d+(?:\.\d+)?)\s*(" + "|".join(sorted(UNITS, key=len, reverse=True)) + r")\s*$")
_UNKNOWN_WORDS = ("unknown", "null", "none", "n/a", "not verified")
_TIME_PREFIX = re.compile(r"^\d{4}-\d{2}-\d{2}([T ]\d{2}(:\d{2}(:\d{2}(\.\d+)?)?)?(Z|[+-]\d{2}:?\d{2})?)?$")
_VERSION_PREFIX = re.compile(r"^\d+\.\d+")


def kind_of(name: str) -> str | None:
    if name.startswith(COMPONENT_PREFIX) and len(name) > len(COMPONENT_PREFIX):
        return "bool"
    return KINDS.get(name)


def fact_of(name: str) -> str:
    """The manifest fact a claim reads (``components.alma-guard`` reads ``components``)."""
    return "components" if name.startswith(COMPONENT_PREFIX) else name


@dataclass(frozen=True)
class Size:
    """A size as written: value, unit and the tolerance its precision implies."""

    number: Decimal
    unit: str
    decimals: int

    @property
    def bytes(self) -> Decimal:
        return self.number * UNITS[self.unit]

    @property
    def tolerance(self) -> Decimal:
        # half a unit of the last stated digit: "1.6 GB" holds for 1.55-1.65 GB
        return Decimal(5) * Decimal(10) ** (-self.decimals - 1) * UNITS[self.unit]

    def describe(self) -> str:
        lo, hi = (self.bytes - self.tolerance) / UNITS[self.unit], (self.bytes + self.tolerance) / UNITS[self.unit]
        return f"{self} (holds for {lo.normalize():f}-{hi.normalize():f} {self.unit})"

    def __str__(self) -> str:
        return f"{self.number:.{self.decimals}f} {self.unit}"


def parse_size(text: str) -> Size | None:
    m = _SIZE.match(text)
    if not m:
        return None
    num = m.group(1)
    return Size(Decimal(num), m.group(2), len(num.split(".")[1]) if "." in num else 0)


def format_size(nbytes: int, like: Size | None = None) -> str:
    """``nbytes`` in the unit and precision of ``like`` (default: decimal, 1 digit for GB)."""
    if like is None:
        for unit, dec in (("TB", 1), ("GB", 1), ("MB", 0), ("kB", 0)):
            if nbytes >= UNITS[unit]:
                like = Size(Decimal(0), unit, dec)
                break
        else:
            return f"{nbytes} B"
    q = Decimal(nbytes) / UNITS[like.unit]
    if nbytes and (q < Decimal(10) ** -like.decimals or q >= 10000):
        return format_size(nbytes)  # "0.0 GB" or "41000 MB" would hide the value: pick a fitting unit
    return f"{q:.{like.decimals}f} {like.unit}"


def is_unknown(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in _UNKNOWN_WORDS)


def normalize(name: str, expected: Any) -> Any:
    """Validate a claim's expected value for its kind; ConfigError (exit 2) when it cannot mean anything."""
    kind = kind_of(name)
    if kind is None:
        known = ", ".join(sorted(KINDS)) + ", components.<name>"
        raise ConfigError(f"unknown claim {name!r}; the claims that exist: {known}", hint="see docs/gates.md, 'Claims'")
    if name.startswith(COMPONENT_PREFIX):
        _known_components([name[len(COMPONENT_PREFIX) :]])
    if is_unknown(expected):
        return None
    if kind == "bool":
        if isinstance(expected, bool):
            return expected
        if isinstance(expected, str) and expected.strip().lower() in ("yes", "true", "no", "false"):
            return expected.strip().lower() in ("yes", "true")
        raise _Invalid(name, expected, kind)
    if kind == "size":
        if isinstance(expected, int) and not isinstance(expected, bool):
            return expected
        if isinstance(expected, str) and (s := parse_size(expected)):
            # "0 TB" holds for anything under 0.5 TB, "2 GB" for 1.5-2.5 GB: a size claim
            # states at least two significant digits (or exact bytes)
            if len(str(s.number).replace(".", "").lstrip("0")) < 2:
                raise ConfigError(
                    f"claim {name!r}: {expected!r} is too coarse to mean anything: {s.describe()}",
                    hint="state at least two significant digits (1.6 GB, 41 MB) or the bytes; see docs/gates.md",
                )
            return s
        raise _Invalid(name, expected, kind)
    if kind == "time":  # an ISO 8601 date or time prefix: "2" would hold for every year 2000-2999
        if isinstance(expected, str) and _TIME_PREFIX.match(expected.strip()):
            return expected.strip()
        raise _Invalid(name, expected, kind, "an ISO 8601 date or time (2026-06-18, 2026-06-18T12:00:00Z)")
    if kind == "version":  # a prefix of at least major.minor: "5" would hold for any 5.x kernel
        text = str(expected).strip() if isinstance(expected, str | int | float) else ""
        if not isinstance(expected, bool) and _VERSION_PREFIX.match(text):
            return text
        raise _Invalid(name, expected, kind, "a version of at least major.minor (5.15, 5.15.185-l4t-r36.5)")
    if kind == "data":  # lists and objects compared whole: blind spots, Proprietary licences, waivers
        if isinstance(expected, dict | list):
            return expected
        raise _Invalid(name, expected, kind, "a list or mapping, e.g. [] for none")
    if kind == "int":
        if isinstance(expected, int) and not isinstance(expected, bool):
            return expected
        if isinstance(expected, str) and expected.strip().isdigit():
            return int(expected)
        raise _Invalid(name, expected, kind)
    if kind == "label":
        if expected in LABELS:
            return expected
        raise ConfigError(f"claim {name!r}: {expected!r} is not one of {', '.join(LABELS)} or null")
    if kind == "sha":
        if isinstance(expected, str) and re.fullmatch(r"[0-9a-f]{8,64}", expected.strip()):
            return expected.strip()
        raise _Invalid(name, expected, kind)
    if kind == "components":
        if isinstance(expected, dict) and all(isinstance(v, bool) for v in expected.values()):
            _known_components(list(expected))
            return expected
        raise _Invalid(name, expected, kind)
    if isinstance(expected, bool | dict | list):
        raise _Invalid(name, expected, kind)
    return str(expected)


class _Invalid(ConfigError):
    """A claim value its kind cannot mean (built only when raised: normalize runs per claim)."""

    def __init__(self, name: str, expected: Any, kind: str, want: str | None = None) -> None:
        what = f"; want {want}" if want else ""
        super().__init__(
            f"claim {name!r}: {expected!r} is not a valid {kind}{what}", hint="see docs/gates.md, 'Claims'"
        )


def _known_components(names: list[str]) -> None:
    """A misspelt component ("alma-gaurd") would read as absent, a false fact: refuse it."""
    unknown = [n for n in names if n not in COMPONENTS]
    if unknown:
        raise ConfigError(
            f"unknown component {', '.join(map(repr, unknown))}; valid components: {', '.join(COMPONENTS)}",
            hint="fix the name (the components ALMA-OS bakes in: layers/meta-alma/recipes-alma/)",
        )


def fact_value(name: str, value: Any) -> Any:
    if name.startswith(COMPONENT_PREFIX):
        if value is None:
            return None
        if not isinstance(value, dict):
            return None
        return value.get(name[len(COMPONENT_PREFIX) :], False)
    return value


def judge(name: str, expected: Any, fact: Any) -> str:
    """HOLDS, STALE or UNBACKED for a normalized claim against the fact's value."""
    if expected is None:
        return HOLDS if fact is None else STALE
    if fact is None:
        return UNBACKED
    kind = kind_of(name)
    if kind == "size":
        if isinstance(expected, Size):
            return HOLDS if abs(Decimal(int(fact)) - expected.bytes) <= expected.tolerance else STALE
        return HOLDS if int(fact) == expected else STALE
    if kind == "version":
        f, e = str(fact), str(expected)
        # a prefix claim ("5.15.185-l4t-r36.5") holds at a component boundary only
        return HOLDS if f == e or (f.startswith(e) and f[len(e)] in "-+.~") else STALE
    if kind in ("sha", "time"):
        return HOLDS if str(fact).startswith(str(expected)) else STALE
    if kind == "components":
        return HOLDS if all(bool(fact.get(k, False)) == v for k, v in expected.items()) else STALE
    return HOLDS if fact == expected else STALE


def show(value: Any, name: str | None = None) -> str:
    if isinstance(value, Size):
        return str(value)
    if name and kind_of(name) == "size" and isinstance(value, int) and not isinstance(value, bool):
        return f"{value} bytes ({format_size(value)})"
    if isinstance(value, str):
        return value
    return json.dumps(value)


def render_value(name: str, fact: Any, previous: Any = None) -> Any:
    """The claim value that states ``fact``, in the shape the author wrote (size unit/precision)."""
    if fact is None:
        return None
    if kind_of(name) == "size" and isinstance(previous, Size):
        return parse_size(format_size(int(fact), previous))
    return fact
