"""Every input file ``alma`` reads goes through here: text, YAML, TOML and JSON, read once, safely.

Threat model (docs/architecture.md, "Input files"): an input file may be in the wrong
encoding, truncated, hostile (a YAML alias bomb, ``1e400``, NaN) or merely mistyped. Each
reader turns every such case into a :class:`~alma.errors.ConfigError` (exit 2) that names
the file and, where it can, the line; nothing here raises anything else for bad content.

- :func:`read_text`: UTF-8 only (a BOM is tolerated); another encoding names the byte.
- :func:`load_yaml`: PyYAML's safe constructors (no Python objects), duplicate keys refused
  with both lines, and aliases either refused (``aliases=False``: gate front matter) or
  bounded (``max_nodes``: the expanded tree may not exceed that many nodes, the classic
  "billion laughs" is refused before anything expands it).
- :func:`load_toml` / :func:`loads_toml`: tomllib on decoded text, deep nesting refused.
- :func:`load_json`: finite numbers only (``NaN``, ``Infinity`` and ``1e400`` are refused).

The composed YAML node tree is returned too (``compose_yaml``) so callers can point at lines.
:func:`read_text`, :func:`decode`, the TOML readers and :class:`LoadError` are the board
library's (``almaboard.config``): host and board read files one way.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Reading text and TOML is the board library's (one reader for host and board, stdlib only);
# re-exported here so every host reader names one module.
from almaboard.config import MAX_CONFIG_BYTES, LoadError, decode, load_toml, loads_toml, read_text

if TYPE_CHECKING:
    import yaml

# An expanded kas file of this project has ~200 nodes; 100k leaves room for any honest file
# and stops a 9-level alias bomb (10^9 nodes) before anything walks it.
MAX_YAML_NODES = 100_000
# Nesting deeper than this is no honest config (kas files nest ~6 levels); the consumers
# (kas's schema validation, repr, json) recurse and would hit the interpreter's limit.
MAX_YAML_DEPTH = 100

_MERGE_TAG = "tag:yaml.org,2002:merge"

__all__ = [
    "MAX_CONFIG_BYTES",
    "LoadError",
    "compose_yaml",
    "construct_yaml",
    "decode",
    "load_json",
    "load_toml",
    "load_yaml",
    "loads_json",
    "loads_toml",
    "read_text",
]


def _yaml() -> tuple[Any, Any]:
    """(the yaml module, its fastest safe loader), imported on first use: JSON-only callers
    (alma verify, the facts manifest) do not pay for PyYAML."""
    import yaml

    return yaml, getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def compose_yaml(
    text: str,
    path: Path | str,
    *,
    aliases: bool = True,
    max_nodes: int = MAX_YAML_NODES,
    line_offset: int = 0,
    hint: str | None = None,
) -> yaml.Node | None:
    """The node tree of one YAML document, checked: no duplicate keys, aliases refused or bounded.

    ``line_offset`` is added to reported lines (front matter starts after a ``---`` line).
    """
    yaml, loader_class = _yaml()
    try:
        if not aliases and "*" in text:  # an alias is written *name: no "*", no alias
            # refuse before composing: the event stream is linear in the text
            for ev in yaml.parse(text, Loader=loader_class):
                if isinstance(ev, yaml.AliasEvent):
                    raise LoadError(
                        path,
                        (ev.start_mark.line + 1 + line_offset) if ev.start_mark else None,
                        f"YAML alias *{ev.anchor} refused: aliases are not allowed here",
                        hint or "write the value out instead of referring to an &anchor",
                    )
        loader = loader_class(text)
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 + line_offset if mark is not None else None
        raise LoadError(path, line, f"not valid YAML: {getattr(exc, 'problem', None) or exc}", hint) from None
    if node is not None:
        _check_tree(node, path, max_nodes, line_offset, hint)
    return node


def _check_tree(root: yaml.Node, path: Path | str, max_nodes: int, line_offset: int, hint: str | None) -> None:
    """Duplicate keys, and the size the tree has once every alias is expanded.

    Aliases share node objects, so the expanded size is computed per distinct node
    (memoised by identity): linear in the document, whatever the expansion would be.
    """
    y, _ = _yaml()
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    # Iterative post-order (deep nesting cannot hit the recursion limit). A node is sized once
    # all its children are: a node shared through an alias may be reached first from any
    # branch, so "children before parents" is enforced per node, not assumed from visit order.
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    entered: set[int] = set()
    while stack:
        node, children_done = stack.pop()
        if id(node) in size:
            continue
        if isinstance(node, y.MappingNode):
            children = [c for kv in node.value for c in kv]
        elif isinstance(node, y.SequenceNode):
            children = list(node.value)
        else:
            children = []
        if not children_done:
            if id(node) in entered:  # on the current path: a recursive alias (&a [*a]) is not a tree
                raise LoadError(
                    path,
                    node.start_mark.line + 1 + line_offset,
                    "YAML refers to itself through an alias (a recursive structure); refused",
                    hint or "write the values out instead of nesting &anchor/*alias references",
                )
            entered.add(id(node))
            if isinstance(node, y.MappingNode):
                _check_duplicate_keys(node, path, line_offset, hint)
            stack.append((node, True))
            stack += [(c, False) for c in children if id(c) not in size]
            continue
        entered.discard(id(node))
        n = 1 + sum(size[id(c)] for c in children)
        size[id(node)] = n
        depth[id(node)] = 1 + max((depth[id(c)] for c in children), default=0)
        if depth[id(node)] > MAX_YAML_DEPTH:
            raise LoadError(
                path,
                node.start_mark.line + 1 + line_offset,
                f"YAML nested more than {MAX_YAML_DEPTH} levels deep; refused",
                hint or "flatten the structure",
            )
        if n > max_nodes:
            raise LoadError(
                path,
                node.start_mark.line + 1 + line_offset,
                f"YAML expands to more than {max_nodes} nodes through aliases (an alias bomb?); refused",
                hint or "write the values out instead of nesting &anchor/*alias references",
            )


def _check_duplicate_keys(node: yaml.MappingNode, path: Path | str, line_offset: int, hint: str | None) -> None:
    y, _ = _yaml()
    keys: dict[str, int] = {}
    for k, _v in node.value:
        if isinstance(k, y.ScalarNode) and k.tag != _MERGE_TAG:
            first = keys.get(k.value)
            keys.setdefault(k.value, k.start_mark.line + 1)
            if first is not None:
                raise LoadError(
                    path,
                    k.start_mark.line + 1 + line_offset,
                    f"duplicate key {k.value!r} (first at line {first + line_offset}); YAML keeps only "
                    "the last one, so the first is silently ignored",
                    hint or "remove or merge one of the two",
                )


def construct_yaml(node: yaml.Node | None, path: Path | str = "<yaml>", *, hint: str | None = None) -> Any:
    """Python data (safe types only) of a node tree from :func:`compose_yaml`.

    A tag the safe constructors do not know (``!!python/object``, ``!custom``) or a value
    its tag cannot hold (``!!int x``) is a LoadError at its line, never a crash."""
    if node is None:
        return None
    yaml, loader_class = _yaml()
    loader = loader_class("")
    try:
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        why = getattr(exc, "problem", None) or str(exc)
        raise LoadError(path, line, f"YAML value refused: {why}", hint or "use plain YAML values (no tags)") from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. !!timestamp 2026-13-45
        raise LoadError(path, None, f"YAML value refused: {exc}", hint or "use plain YAML values (no tags)") from None
    finally:
        loader.dispose()


def load_yaml(path: Path, *, aliases: bool = True, max_nodes: int = MAX_YAML_NODES, hint: str | None = None) -> Any:
    text = read_text(path, what="YAML file", hint=hint, max_bytes=MAX_CONFIG_BYTES)
    return construct_yaml(compose_yaml(text, path, aliases=aliases, max_nodes=max_nodes, hint=hint), path, hint=hint)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range (not a finite double)")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads_json(text: str, path: Path | str, *, hint: str | None = None) -> Any:
    try:
        return json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise LoadError(path, exc.lineno, f"not valid JSON: {exc.msg}", hint) from None
    except ValueError as exc:
        raise LoadError(path, None, f"not valid JSON: {exc}", hint) from None
    except RecursionError:
        raise LoadError(path, None, "not valid JSON: nested too deeply", hint) from None


def load_json(path: Path, *, hint: str | None = None) -> Any:
    return loads_json(read_text(path, what="JSON file", hint=hint), path, hint=hint)
