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
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from alma.errors import ConfigError
from alma.gates.claims import COMPONENT_PREFIX, kind_of, normalize

MARKER = re.compile(r"<!--\s*fact:\s*(?P<expr>.*?)\s*-->(?P<value>.*?)<!--\s*/fact\s*-->")
_OPEN = re.compile(r"<!--\s*fact:")
_CLOSE = re.compile(r"<!--\s*/fact\s*-->")
_EXPR = re.compile(r"^(?P<name>[A-Za-z_][\w.-]*)\s*(?:\|\s*(?P<filter>.+))?$")
FRONT_KEYS = {"gate", "machine", "image", "claims", "facts", "title", "owner", "description"}

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class Claim:
    name: str
    raw: Any  # as written in the doc
    expected: Any  # normalized (claims.normalize)
    line: int  # 1-based line in the file
    span: tuple[int, int] | None  # columns of the value within the line, when rewritable
    where: str  # "front" | "inline"
    filter: str | None = None  # inline only: a jinja2 filter applied to the fact when rendering


@dataclass
class GateDoc:
    path: Path
    lines: list[str]  # with their line endings
    gate: str
    machine: str
    image: str
    facts: str | None
    claims: list[Claim] = field(default_factory=list)
    body_start: int = 0  # index of the first body line

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
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise _err(path, None, "no such gate document", hint="alma gates check docs/gates/") from None
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip("\r\n") != "---":
        raise _err(path, 1, "no YAML front matter (the file must start with a '---' line)")
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip("\r\n") in ("---", "...")), None)
    if end is None:
        raise _err(path, 1, "front matter is not closed (no second '---' line)")
    fm = "".join(lines[1:end])
    try:
        loader = _Loader(fm)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 2 if mark is not None else 1
        raise _err(path, line, f"front matter is not valid YAML: {getattr(exc, 'problem', exc)}") from exc
    if not isinstance(data, dict):
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
    doc = GateDoc(path, lines, data["gate"], data["machine"], data["image"], facts, body_start=end + 1)

    claims_node = None
    for k, v in node.value:
        if k.value == "claims":
            claims_node = v
    if claims_node is not None and not (isinstance(claims_node, yaml.MappingNode) or data.get("claims") is None):
        raise _err(path, claims_node.start_mark.line + 2, "claims: must be a mapping of claim -> expected value")
    if isinstance(claims_node, yaml.MappingNode):
        for knode, vnode in claims_node.value:
            name = str(knode.value)
            if name == "components" and isinstance(vnode, yaml.MappingNode):
                for ck, cv in vnode.value:
                    doc.claims.append(
                        _front_claim(path, f"{COMPONENT_PREFIX}{ck.value}", cv, data["claims"]["components"][ck.value])
                    )
                continue
            doc.claims.append(_front_claim(path, name, vnode, data["claims"][knode.value]))

    for lineno, line in doc.body():
        rest = MARKER.sub("", line)
        if _OPEN.search(rest) or _CLOSE.search(rest):
            raise _err(
                path,
                lineno,
                "unmatched fact marker (open and close on the same line: <!-- fact:NAME -->value<!-- /fact -->)",
            )
        for m in MARKER.finditer(line):
            em = _EXPR.match(m.group("expr"))
            if not em:
                raise _err(path, lineno, f"bad fact marker expression {m.group('expr')!r} (want NAME or NAME | filter)")
            name = em.group("name")
            raw = m.group("value")
            try:
                expected = normalize(name, parse_inline_value(name, raw))
            except ConfigError as exc:
                raise _err(path, lineno, exc.message, exc.hint) from None
            doc.claims.append(Claim(name, raw, expected, lineno, m.span("value"), "inline", em.group("filter")))
    if not doc.claims:
        raise _err(path, 2, "the document makes no checkable claim (no claims: and no fact markers)")
    return doc


def _front_claim(path: Path, name: str, vnode: Any, raw: Any) -> Claim:
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
    return Claim(name, raw, expected, line, span, "front")
