"""Unmarked prose that makes a checkable claim: reported as a warning naming the line.

"cannot be built", "not yet flashed", a kernel version or a size written as plain text
cannot be re-checked when the artefacts change: mark it (``<!-- fact:... -->``) or claim
it in the front matter. The built-in patterns can be extended or replaced by
``patterns.toml`` next to the gate documents (docs/gates/patterns.toml), format in
docs/gates.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from alma import loader
from alma.errors import ConfigError


@dataclass(frozen=True)
class Pattern:
    name: str
    regex: re.Pattern[str]
    claim: str  # the claim (fact) that would back this prose
    message: str = ""


DEFAULTS: list[tuple[str, str, str]] = [
    (
        "cannot-be-built",
        r"(?i)\b(?:cannot|can ?not|can't|could not|couldn't|won't|will not) be built\b",
        "image_buildable",
    ),
    ("not-buildable", r"(?i)\b(?:not|un)(?: yet)? ?buildable\b", "image_buildable"),
    ("build-fails", r"(?i)\bbuild (?:fails|failed|is broken|does not work)\b", "image_buildable"),
    ("not-flashed", r"(?i)\b(?:not(?: yet)?|never(?: been)?|un) ?flashed\b", "flashed"),
    ("not-booted", r"(?i)\b(?:not(?: yet)?|never(?: been)?) booted\b", "booted"),
    ("status-label", r"\b(?:Prototype|Flashed|Booted)\b", "status"),
    ("kernel-version", r"\b\d+\.\d+\.\d+-l4t[\w.+-]*|\b(?:kernel|Linux)\s+v?\d+\.\d+(?:\.\d+)?\b", "kernel_version"),
    ("size", r"~?\b\d+(?:\.\d+)?\s?(?:[kKMGT]i?B)\b", "bundle_bytes"),
]

IGNORE_MARK = "<!-- gates:ignore -->"


def defaults() -> list[Pattern]:
    return [Pattern(n, re.compile(r), c) for n, r, c in DEFAULTS]


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
        pats[e["name"]] = Pattern(e["name"], rx, str(e.get("claim", "?")), str(e.get("message", "")))
    return list(pats.values())


@dataclass
class Hit:
    line: int
    pattern: Pattern
    text: str


def scan(prose: list[tuple[int, str]], patterns: list[Pattern]) -> list[Hit]:
    """Pattern hits in prose: lines with fact markers and HTML comments already blanked out
    and lines marked IGNORE_MARK already dropped (``GateDoc.prose``)."""
    hits: list[Hit] = []
    for lineno, line in prose:
        for p in patterns:
            m = p.regex.search(line)
            if m:
                hits.append(Hit(lineno, p, m.group(0)))
    return hits
