"""Unmarked prose that makes a checkable claim: reported as a warning naming the line.

"cannot be built", "not yet flashed", a kernel version or a size written as plain text
cannot be re-checked when the artefacts change: mark it (``<!-- fact:... -->``) or claim
it in the front matter. The built-in patterns can be extended or replaced by
``patterns.toml`` next to the gate documents (docs/gates/patterns.toml), format in
docs/gates.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from alma import loader
from alma.errors import ConfigError

if TYPE_CHECKING:
    from alma.gates.doc import Prose


@dataclass(frozen=True)
class Pattern:
    name: str
    regex: re.Pattern[str]
    claim: str  # the claim (fact) that would back this prose
    message: str = ""
    # ASCII words one of which every match contains (compared lower-case; DIGIT: any digit):
    # only lines holding one are searched with the regex. Empty: every line is searched.
    needles: tuple[str, ...] = ()


DIGIT = "<digit>"


DEFAULTS: list[tuple[str, str, str, tuple[str, ...]]] = [
    (
        "cannot-be-built",
        r"(?i)\b(?:cannot|can ?not|can't|could not|couldn't|won't|will not) be built\b",
        "image_buildable",
        ("buil",),  # built, buildable, build: one pass for the three
    ),
    ("not-buildable", r"(?i)\b(?:not|un)(?: yet)? ?buildable\b", "image_buildable", ("buil",)),
    ("build-fails", r"(?i)\bbuild (?:fails|failed|is broken|does not work)\b", "image_buildable", ("buil",)),
    ("not-flashed", r"(?i)\b(?:not(?: yet)?|never(?: been)?|un) ?flashed\b", "flashed", ("flashed",)),
    ("not-booted", r"(?i)\b(?:not(?: yet)?|never(?: been)?) booted\b", "booted", ("booted",)),
    ("status-label", r"\b(?:Prototype|Flashed|Booted)\b", "status", ("prototype", "flashed", "booted")),
    (
        "kernel-version",
        r"\b\d+\.\d+\.\d+-l4t[\w.+-]*|\b(?:kernel|Linux)\s+v?\d+\.\d+(?:\.\d+)?\b",
        "kernel_version",
        (DIGIT,),  # both alternatives hold a digit
    ),
    (
        "size",
        r"~?\b\d+(?:\.\d+)?\s?(?:[kKMGT]i?B)\b",
        "bundle_bytes",
        (DIGIT,),
    ),
]

IGNORE_MARK = "<!-- gates:ignore -->"


def defaults() -> list[Pattern]:
    return [Pattern(n, re.compile(r), c, needles=k) for n, r, c, k in DEFAULTS]


def load(path: Path | None) -> list[Pattern]:
    """Built-ins, then ``path`` (if it exists): ``replace = true`` drops the built-ins,
    ``[[pattern]]`` tables add or override by name, ``enabled = false`` removes one."""
    pats = {p.name: p for p in defaults()}
    if path is None or not path.is_file():
        return list(pats.values())
    data = loader.load_toml(path, hint="fix the patterns file; format: docs/gates.md, 'Patterns'")
    if data.get("replace") is True:
        pats = {}
    entries = data.get("pattern", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: 'pattern' must be an array of tables ([[pattern]])")
    for i, e in enumerate(entries, 1):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str):
            raise ConfigError(f'{path}: pattern #{i} needs name = "..."')
        if e.get("enabled") is False:
            pats.pop(e["name"], None)
            continue
        if not isinstance(e.get("regex"), str):
            raise ConfigError(f"{path}: pattern {e['name']!r} needs regex = '...'")
        try:
            rx = re.compile(e["regex"])
        except re.error as exc:
            raise ConfigError(f"{path}: pattern {e['name']!r}: bad regex: {exc}") from exc
        needles = e.get("needles", [])
        if not isinstance(needles, list) or not all(isinstance(n, str) and n and n.isascii() for n in needles):
            raise ConfigError(f"{path}: pattern {e['name']!r}: needles must be a list of ASCII words")
        pats[e["name"]] = Pattern(
            e["name"], rx, str(e.get("claim", "?")), str(e.get("message", "")), tuple(n.lower() for n in needles)
        )
    return list(pats.values())


@dataclass
class Hit:
    line: int
    pattern: Pattern
    text: str


def scan(prose: Prose, patterns: list[Pattern]) -> list[Hit]:
    """The first hit of each pattern on each line of ``prose`` (GateDoc.prose: markers and
    comments already blanked out, ignored lines emptied), in line order.

    A pattern with needles searches only the lines holding one of them (found with
    bytes.find over the ASCII-lowered text, so a long document costs a few passes in C) and
    every line with a non-ASCII character (where a Unicode case fold might match a needle).
    """
    raw = prose.text.encode("utf-8")
    low = raw.translate(_FOLD)  # ASCII lower-case, digits as one byte: same length, offsets stay valid
    non_ascii = {} if raw.isascii() else _lines_at(raw, (m.start() for m in _NON_ASCII.finditer(raw)))
    all_lines: dict[int, int] | None = None
    found: dict[str, dict[int, int]] = {}
    hits: list[tuple[int, int, Hit]] = []  # (start offset, pattern index, hit): sorted into line order
    for order, p in enumerate(patterns):
        if p.needles:
            spans = dict(non_ascii)
            for needle in p.needles:
                if needle not in found:  # patterns share needles: one pass each
                    key = _DIGIT_BYTE if needle == DIGIT else needle.encode().translate(_FOLD)
                    hits_at = _find_all(low, key)
                    found[needle] = _lines_at(low, hits_at)
                spans.update(found[needle])
            spans = dict(sorted(spans.items()))
        else:
            if all_lines is None:
                all_lines = _lines_at(raw, _find_all(raw, b"\n", every_line=True))
            spans = all_lines
        for start, end in spans.items():
            m = p.regex.search(raw[start:end].decode("utf-8"))
            if m:
                hits.append((start, order, Hit(0, p, m.group(0))))
    hits.sort(key=lambda h: (h[0], h[1]))
    out = []
    line, counted = prose.first_line, 0
    for start, _, hit in hits:  # line numbers by counting forward once
        line += raw.count(b"\n", counted, start)
        counted = start
        out.append(Hit(line, hit.pattern, hit.text))
    return out


_NON_ASCII = re.compile(rb"[^\x00-\x7f]")


def _find_all(raw: bytes, needle: bytes, every_line: bool = False) -> list[int]:
    """Offsets of ``needle``, at most one per line (every line's start with ``every_line``)."""
    if every_line:
        out = [0] if raw else []
        at = raw.find(needle)
        while at >= 0 and at + 1 < len(raw):
            out.append(at + 1)
            at = raw.find(needle, at + 1)
        return out
    out = []
    at = raw.find(needle)
    while at >= 0:
        out.append(at)
        end = raw.find(b"\n", at)
        if end < 0:
            break
        at = raw.find(needle, end)
    return out


# bytes.lower() plus every digit folded to one byte, so "a digit" is one bytes.find pass
_DIGIT_BYTE = b"\x00"
_FOLD = bytes.maketrans(bytes(range(65, 91)) + b"0123456789", bytes(range(97, 123)) + _DIGIT_BYTE * 10)


def _lines_at(raw: bytes, offsets: Iterable[int]) -> dict[int, int]:
    """{line start: line end (its newline excluded)} of the lines holding ``offsets``."""
    spans: dict[int, int] = {}
    for at in offsets:
        start = raw.rfind(b"\n", 0, at) + 1
        if start not in spans:
            end = raw.find(b"\n", at)
            spans[start] = len(raw) if end < 0 else end
    return spans
