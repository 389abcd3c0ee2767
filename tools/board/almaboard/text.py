"""The one sanitizer for untrusted text (node output, kernel log lines, guard reasons, aliases).

Text produced on a board may be broken, hostile or simply wrong; before it reaches a
terminal, a Nagios line, a JSON document or a web page it passes through one of these:

- ``terminal(s)``: every C0/C1 control, DEL, ESC sequence introducer, bidi override or
  other format character, line/paragraph separator and lone surrogate is shown as a
  visible escape (``\\x1b`` -> ``␛``, ``\\u202e`` -> ``<U+202E>``), never passed on and never
  silently dropped: the reader sees that something was there.
- ``nagios_text(s)`` / ``nagios_label(s)``: ``terminal`` plus the plugin guidelines'
  separators (``|`` starts perfdata; ``'`` and ``=`` delimit a label; a newline starts a
  long-output line).
- ``perf_number(v)``: a perfdata value as plain decimal with a fixed precision, or None
  when it is not a finite number of sane size (nan, inf, a 301-digit integer).
- ``finite(obj)`` / ``dumps(obj)``: JSON with finite numbers only (non-finite -> null).
- ``html_text(s)``: ``terminal`` for the visible text; the page escapes it (autoescape) and
  isolates it in ``<bdi>``.
- ``is_hostname(s)``: the one grammar of a board's name (the flash hook's, in sh, is the same).

Stdlib only: the board runs it too.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from typing import Any

# Control Pictures (U+2400..U+241F) show C0 controls as one visible glyph each.
_C0_PICTURE = {i: chr(0x2400 + i) for i in range(0x20)}
_C0_PICTURE[0x7F] = "\u2421"  # ␡
# |v| at or above this is not a measurement (a 301-digit integer, 1e300): no perf value.
PERF_LIMIT = 1e15
PERF_DECIMALS = 3


def _visible(ch: str, keep_newline: bool) -> str:
    o = ord(ch)
    if ch == "\n" and keep_newline:
        return ch
    if o < 0x20 or o == 0x7F:
        return _C0_PICTURE[o]
    if 0x80 <= o <= 0x9F:
        return f"\\x{o:02x}"  # C1 (CSI is 0x9b): shown as an escape, never emitted
    if 0xD800 <= o <= 0xDFFF:
        return f"\\x{o - 0xDC00:02x}" if o >= 0xDC80 else f"<U+{o:04X}>"  # surrogateescape'd byte
    return f"<U+{o:04X}>"


def _unsafe(ch: str) -> bool:
    o = ord(ch)
    if o < 0x20 or 0x7F <= o <= 0x9F:
        return True
    if o < 0xA0:
        return False
    # Cf: bidi embeddings/overrides/isolates, zero-width joiners, BOM, soft hyphen...;
    # Zl/Zp: U+2028/U+2029 break lines in some terminals; Cs: lone surrogates; Co/Cn are
    # left alone (private use and unassigned code points print as boxes, harmlessly).
    return unicodedata.category(ch) in ("Cf", "Zl", "Zp", "Cs")


def terminal(s: object, *, keep_newline: bool = False) -> str:
    """``s`` with every control/format character made visible (one line unless keep_newline)."""
    text = s if isinstance(s, str) else str(s)
    if not any(_unsafe(ch) for ch in text):
        return text
    return "".join(_visible(ch, keep_newline) if _unsafe(ch) else ch for ch in text)


def from_bytes(raw: bytes) -> str:
    """Decode untrusted bytes: invalid UTF-8 shows as ``\\xNN`` (via terminal()), nothing lost."""
    return raw.decode("utf-8", "surrogateescape")


def nagios_text(s: object) -> str:
    """Plugin output text: one line, no ``|`` (it would start perfdata)."""
    return terminal(s).replace("|", "/")


def nagios_label(s: object) -> str:
    """A perfdata label (quoted): no ``'``, ``=``, ``|``, whitespace or controls; never empty.

    Quoted labels may hold blanks by the guidelines, but many perfdata parsers split on
    them: an underscore is unambiguous everywhere.
    """
    out = "".join("_" if ch in "'=|" or ch.isspace() else ch for ch in terminal(s))
    return out or "_"


def perf_number(v: object, decimals: int = PERF_DECIMALS) -> str | None:
    """Plain decimal with at most ``decimals`` places, or None (not a sane finite number)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:  # int too large for a float
        return None
    if not math.isfinite(f) or abs(f) >= PERF_LIMIT:
        return None
    text = f"{f:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def finite(obj: Any) -> Any:
    """A copy of ``obj`` for JSON: non-finite floats (and ints beyond a float) become None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return obj if abs(obj) < 2**63 else None
    if isinstance(obj, dict):
        return {str(k): finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, **kw: Any) -> str:
    """``json.dumps`` that only ever writes strict JSON (no NaN/Infinity, ASCII escapes)."""
    kw.setdefault("ensure_ascii", True)
    return json.dumps(finite(obj), allow_nan=False, **kw)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"not a finite number: {name}")


def loads(text: str | bytes) -> Any:
    """``json.loads`` that refuses NaN/Infinity (strict parsers such as Node's reject them)."""
    return json.loads(text, parse_constant=_reject_constant)


def html_text(s: object) -> str:
    """Visible text for a web page (escape it, and wrap it in <bdi>, in the template)."""
    return terminal(s)


# UOMs the monitoring-plugins guidelines define; anything else is dropped (value kept).
NAGIOS_UOMS = frozenset({"", "s", "ms", "us", "%", "B", "KB", "MB", "GB", "TB", "c"})


def perf_item(
    label: object,
    value: object,
    uom: object = "",
    warn: object = None,
    crit: object = None,
    lo: object = None,
    hi: object = None,
    *,
    low: bool = False,
) -> str | None:
    """``'label'=value[UOM];warn;crit;min;max``, or None when the value is not a sane number.

    Upper-bound thresholds are the guidelines' plain ``N`` (alert when the value is above
    N); lower-bound ones (``low``: alert when it falls below) are ``N:``. A threshold or
    bound that is not a sane number is left empty.
    """
    val = perf_number(value)
    if val is None:
        return None  # nan, inf, 1e300: graphing it would be a lie; leave the point out
    unit = uom if isinstance(uom, str) and uom in NAGIOS_UOMS else ""

    def num(v: object, rng: bool = False) -> str:
        s = perf_number(v)
        if s is None:
            return ""
        return f"{s}:" if rng and low else s

    return f"'{nagios_label(label)}'={val}{unit};{num(warn, True)};{num(crit, True)};{num(lo)};{num(hi)}"


_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def is_hostname(name: object) -> bool:
    """An RFC 1123 label: 1-63 of A-Z a-z 0-9 '-', no '-' at either end, not only digits."""
    return isinstance(name, str) and _HOSTNAME.fullmatch(name) is not None and not name.isdigit()
