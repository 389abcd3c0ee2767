"""Parse a gate document: YAML front matter with ``claims:``, and inline fact markers.

```
---
gate: alma-os
machine: jetson-orin-nano-devkit
image: alma-image
claims:
  image_buildable: true
  bundle_bytes: 1.6 GB
---
The kernel is <!-- fact:kernel_version -->5.15.185-l4t-r36.5<!-- /fact -->.
```

Every claim keeps its line (and the column span of its value) so ``check`` can point at
it and ``render`` can rewrite exactly that value in place, leaving the prose alone.

Threat model (docs/gates.md, "Threat model"): a gate document is text anyone can edit in a
pull request. It is read through ``alma.loader`` (UTF-8 only; YAML aliases refused in the
front matter, so an alias bomb never expands; duplicate keys refused), and markers are
found by one left-to-right scan per line (:func:`split_line`), linear in the line's length
whatever it holds (20,000 unclosed ``<!-- fact:x`` took 41 s with the old regex).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from alma import loader
from alma.errors import ConfigError
from alma.gates.claims import COMPONENT_PREFIX, kind_of, normalize
from alma.gates.patterns import IGNORE_MARK

# Anchored at a "<!--" found by str.find: each is tried once, at one position.
_OPEN_AT = re.compile(r"<!--\s*fact:")
_CLOSE_AT = re.compile(r"<!--\s*/fact\s*-->")
_EXPR = re.compile(r"^(?P<name>[A-Za-z_][\w.-]*)\s*(?:\|\s*(?P<filter>.+))?$")
_FRONT_END = re.compile(r"^(?:---|\.\.\.)\r?$", re.M)
FRONT_KEYS = {"gate", "machine", "image", "claims", "policy", "facts", "title", "owner", "description"}
UNMATCHED = "unmatched fact marker (open and close on the same line: <!-- fact:NAME -->value<!-- /fact -->)"


@dataclass(frozen=True)
class Marker:
    expr: str  # NAME or NAME | filter, stripped
    value: str  # the text between the markers
    span: tuple[int, int]  # columns of the value within the line


def split_line(line: str) -> tuple[list[Marker], str]:
    """The fact markers of one line and its prose (markers, then HTML comments, blanked out).

    Two passes with str.find from cursors that only move forward: linear in len(line),
    whatever it holds. Raises ValueError(UNMATCHED) for an open marker without its close
    (or a close without its open).
    """
    if "<!--" not in line:
        return [], line
    markers: list[Marker] = []
    kept: list[str] = []  # the line without its markers
    i = 0
    while True:
        j = line.find("<!--", i)
        if j < 0:
            break
        opened = _OPEN_AT.match(line, j)
        if opened is None:
            if _CLOSE_AT.match(line, j):
                raise ValueError(UNMATCHED)
            kept.append(line[i : j + 4])  # a plain comment: pass 2 blanks it
            i = j + 4
            continue
        k = line.find("-->", opened.end())
        if k < 0:
            raise ValueError(UNMATCHED)
        start = k + 3
        c = line.find("<!--", start)
        while c >= 0 and not _CLOSE_AT.match(line, c):
            if _OPEN_AT.match(line, c):
                raise ValueError(UNMATCHED)  # a marker opened inside another's value
            c = line.find("<!--", c + 4)
        if c < 0:
            raise ValueError(UNMATCHED)
        close = _CLOSE_AT.match(line, c)
        assert close is not None
        markers.append(Marker(line[opened.end() : k].strip(), line[start:c], (start, c)))
        kept += [line[i:j], " "]
        i = close.end()
    kept.append(line[i:])
    rest = "".join(kept)
    prose: list[str] = []
    i = 0
    while True:  # HTML comments, leftmost first, each to its first "-->"
        j = rest.find("<!--", i)
        end = rest.find("-->", j + 4) if j >= 0 else -1
        if end < 0:
            break
        prose += [rest[i:j], " "]
        i = end + 3
    prose.append(rest[i:])
    return markers, "".join(prose)


@dataclass
class Claim:
    name: str
    raw: Any  # as written in the doc
    expected: Any  # normalized (claims.normalize)
    line: int  # 1-based line in the file
    span: tuple[int, int] | None  # columns of the value within the line, when rewritable
    where: str  # "front" | "inline" | "policy" (a limit a reviewer set: never rewritten by render)
    filter: str | None = None  # inline only: a jinja2 filter applied to the fact when rendering


@dataclass(frozen=True)
class Prose:
    """The body as the unmarked-claim patterns see it: markers and comments blanked, lines
    marked ``<!-- gates:ignore -->`` emptied, every line where it was (``first_line`` is the
    body's first line number)."""

    text: str
    first_line: int


def split_lines(text: str) -> list[str]:
    """Lines with their endings, split at "\n" only (what editors and the marker scan count)."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


@dataclass
class GateDoc:
    path: Path
    text: str
    gate: str
    machine: str
    image: str
    facts: str | None
    claims: list[Claim] = field(default_factory=list)
    body_start: int = 0  # index of the first body line
    prose: Prose = Prose("", 1)

    @cached_property
    def lines(self) -> list[str]:
        return split_lines(self.text)

    def body(self) -> list[tuple[int, str]]:
        return [(i + 1, self.lines[i]) for i in range(self.body_start, len(self.lines))]


def _err(path: Path, line: int | None, msg: str, hint: str | None = None) -> ConfigError:
    where = f"{path}:{line}" if line else str(path)
    return ConfigError(f"{where}: {msg}", hint=hint or "fix the document; format: docs/gates.md")


def parse_inline_value(name: str, text: str) -> Any:
    """What the text between markers claims, in the claim's kind."""
    t = text.strip()
    kind = kind_of(name)
    if kind == "int" and t.replace(",", "").isdigit():
        return int(t.replace(",", ""))
    return t


def parse(path: Path, text: str | None = None) -> GateDoc:
    path = Path(path)
    if text is None:
        text = loader.read_text(path, what="gate document", hint="save it as UTF-8; format: docs/gates.md")
    first_nl = text.find("\n")
    first = text if first_nl < 0 else text[:first_nl]
    if first.rstrip("\r") != "---":
        raise _err(path, 1, "no YAML front matter (the file must start with a '---' line)")
    close = _FRONT_END.search(text, first_nl + 1) if first_nl >= 0 else None
    if close is None:
        raise _err(path, 1, "front matter is not closed (no second '---' line)")
    fm = text[first_nl + 1 : close.start()]
    body_offset = close.end() + 1 if close.end() < len(text) else close.end()
    end = text.count("\n", 0, close.start())  # index of the closing line
    # no aliases: a gate doc is reviewed text, and an alias bomb must never expand
    node = loader.compose_yaml(
        fm, path, aliases=False, line_offset=1, hint="fix the front matter; format: docs/gates.md"
    )
    data = loader.construct_yaml(node, path)
    if not isinstance(data, dict) or node is None:
        raise _err(path, 2, "front matter must be a mapping (gate:, machine:, image:, claims:)")
    unknown = sorted(set(map(str, data)) - FRONT_KEYS)
    if unknown:
        raise _err(
            path, 2, f"unknown front matter key(s): {', '.join(unknown)} (known: {', '.join(sorted(FRONT_KEYS))})"
        )
    for key in ("gate", "machine", "image"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise _err(path, 2, f"front matter needs {key}: <text>")
    facts = data.get("facts")
    if facts is not None and not isinstance(facts, str):
        raise _err(path, 2, "facts: must be a path to a facts manifest")
    doc = GateDoc(path, text, data["gate"], data["machine"], data["image"], facts, body_start=end + 1)

    for section, where in (("claims", "front"), ("policy", "policy")):
        _front_section(doc, node, data, section, where)

    doc.prose = _scan_body(doc, text, body_offset)
    if not doc.claims:
        raise _err(path, 2, "the document makes no checkable claim (no claims: and no fact markers)")
    return doc


def _scan_body(doc: GateDoc, text: str, offset: int) -> Prose:
    """Claims from the fact markers of the body, and its prose: only lines holding "<!--" are
    visited (found with str.find), so a body of plain prose costs one pass in C."""
    pieces: list[str] = []
    done = offset  # text[offset:done] is already in pieces
    lineno = doc.body_start + 1
    counted = offset  # lineno is the line of text[counted]
    pos = text.find("<!--", offset)
    while pos >= 0:
        start = text.rfind("\n", 0, pos) + 1
        stop = text.find("\n", pos)
        stop = len(text) if stop < 0 else stop + 1
        lineno += text.count("\n", counted, start)
        counted = start
        line = text[start:stop]
        try:
            markers, prose = split_line(line)
        except ValueError as exc:
            raise _err(doc.path, lineno, str(exc)) from None
        if IGNORE_MARK in line:  # the author's "this line claims nothing"
            prose = "\n" if line.endswith("\n") else ""
        pieces += [text[done:start], prose]
        done = stop
        for m in markers:
            em = _EXPR.match(m.expr)
            if not em:
                raise _err(doc.path, lineno, f"bad fact marker expression {m.expr[:80]!r} (want NAME or NAME | filter)")
            name = em.group("name")
            try:
                expected = normalize(name, parse_inline_value(name, m.value))
            except ConfigError as exc:
                raise _err(doc.path, lineno, exc.message, exc.hint) from None
            doc.claims.append(Claim(name, m.value, expected, lineno, m.span, "inline", em.group("filter")))
        pos = text.find("<!--", stop)
    pieces.append(text[done:])
    return Prose("".join(pieces), doc.body_start + 1)


def _front_section(doc: GateDoc, node: Any, data: dict[str, Any], section: str, where: str) -> None:
    """``claims:`` (what the artefacts are: render may restate them) or ``policy:`` (limits a
    reviewer set, e.g. ``cve_unpatched_critical: 0``: judged the same, never rewritten)."""
    path = doc.path
    sec_node = next((v for k, v in node.value if k.value == section), None)
    if sec_node is not None and not (isinstance(sec_node, yaml.MappingNode) or data.get(section) is None):
        raise _err(path, sec_node.start_mark.line + 2, f"{section}: must be a mapping of claim -> expected value")
    if not isinstance(sec_node, yaml.MappingNode):
        return
    for knode, vnode in sec_node.value:
        name = str(knode.value)
        if name == "components" and isinstance(vnode, yaml.MappingNode):
            for ck, cv in vnode.value:
                raw = data[section]["components"][ck.value]
                doc.claims.append(_front_claim(path, f"{COMPONENT_PREFIX}{ck.value}", cv, raw, where))
            continue
        doc.claims.append(_front_claim(path, name, vnode, data[section][knode.value], where))


def _front_claim(path: Path, name: str, vnode: Any, raw: Any, where: str = "front") -> Claim:
    line = vnode.start_mark.line + 2  # +1 for 1-based, +1 for the opening '---'
    if raw is not None and kind_of(name) in ("version", "text", "sha", "time") and isinstance(vnode, yaml.ScalarNode):
        raw = vnode.value  # as written: YAML would read 5.10 as the float 5.1
    try:
        expected = normalize(name, raw)
    except ConfigError as exc:
        raise _err(path, line, exc.message, exc.hint) from None
    span = None
    if isinstance(vnode, yaml.ScalarNode) and vnode.start_mark.line == vnode.end_mark.line:
        span = (vnode.start_mark.column, vnode.end_mark.column)
    return Claim(name, raw, expected, line, span, where)
