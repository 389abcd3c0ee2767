"""The one TOML reader of host and board, and layered configuration with ``file:line`` errors.

:func:`read_text` / :func:`decode` / :func:`loads_toml` turn a file into data or into a
:class:`LoadError` (a ConfigError, exit 2) naming ``file:line``: unreadable, over a size
limit, not UTF-8, not TOML, nested deeply enough to exhaust tomllib's recursion. The host's
``alma.loader`` reads every TOML file (and the text of its YAML and JSON) through these.

``/etc/alma/guard.toml`` then ``/etc/alma/guard.d/*.toml`` in name order (per-board measured
values go in a drop-in such as ``guard.d/50-board.toml``); later files override earlier
ones key by key. A missing file means defaults; a broken one is a :class:`ConfigError`
naming ``file:line``. :class:`Layers` remembers where every key was set, so a value that
parses but is wrong (an unknown key, a negative hold-off) is reported at its line too.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

# A config file bigger than this is no honest one (the largest of this project is ~4 KB):
# refused before it is read, so a huge scalar costs nothing.
MAX_CONFIG_BYTES = 4 << 20


class LoadError(ConfigError):
    """An input file that cannot be used; ``path``, ``line`` (0: unknown) and ``why`` apart."""

    def __init__(self, path: Path | str, line: int | None, why: str, hint: str | None = None) -> None:
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {why}", hint=hint or f"fix {path}")
        self.path, self.line, self.why = Path(path), line or 0, why


def read_text(path: Path, *, what: str = "file", hint: str | None = None, max_bytes: int | None = None) -> str:
    """The file's text. Missing, unreadable, over ``max_bytes`` or not UTF-8 -> LoadError naming it."""
    try:
        with Path(path).open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if max_bytes is not None and size > max_bytes:
                raise LoadError(
                    path, None, f"{what} of {size} bytes, over the {max_bytes >> 20} MiB a {what} may have", hint
                )
            data = fh.read() if max_bytes is None else fh.read(max_bytes + 1)
        if max_bytes is not None and len(data) > max_bytes:  # grew while read
            raise LoadError(path, None, f"{what} over the {max_bytes >> 20} MiB a {what} may have", hint)
    except FileNotFoundError:
        raise LoadError(path, None, f"{what} not found", hint) from None
    except IsADirectoryError:
        raise LoadError(path, None, f"{what} is a directory", hint) from None
    except OSError as exc:
        raise LoadError(path, None, f"cannot read {what}: {exc.strerror}", hint) from None
    return decode(data, path, what=what, hint=hint)


def decode(data: bytes, path: Path | str, *, what: str = "file", hint: str | None = None) -> str:
    """UTF-8 text (a BOM is tolerated); another encoding -> LoadError naming the line and byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise LoadError(
            path,
            line,
            f"{what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            hint or f"save {path} as UTF-8 (iconv -f LATIN1 -t UTF-8), then run again",
        ) from None


_LINE = re.compile(r"\s*\(at line (\d+), column (\d+)\)")


def loads_toml(
    text: str, path: Path | str, *, hint: str | None = None, label: str = "not valid TOML"
) -> dict[str, Any]:
    """tomllib on decoded text; a syntax error (at tomllib's line) or nesting deep enough to
    exhaust tomllib's recursion (``a = [[[[...``: a few hundred levels) -> LoadError."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = _LINE.search(str(exc))  # the line goes in front (file:line:), the column stays
        why = _LINE.sub("", str(exc)).strip() + (f" (column {m.group(2)})" if m else "")
        raise LoadError(path, int(m.group(1)) if m else None, f"{label}: {why}", hint) from None
    except RecursionError:
        raise LoadError(path, None, f"{label}: nested too deeply", hint or "flatten the structure") from None


def load_toml(path: Path, *, hint: str | None = None) -> dict[str, Any]:
    """A whole TOML file, at most :data:`MAX_CONFIG_BYTES`, read and parsed as above."""
    return loads_toml(read_text(path, what="TOML file", hint=hint, max_bytes=MAX_CONFIG_BYTES), path, hint=hint)


_TABLE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")
_KEY = re.compile(r"""^\s*("(?:[^"\\]|\\.)*"|'[^']*'|[A-Za-z0-9_.\-"' ]+?)\s*=""")


def _split_key(text: str) -> tuple[str, ...]:
    parts: list[str] = []
    for m in re.finditer(r'"((?:[^"\\]|\\.)*)"|\'([^\']*)\'|([^.\s]+)', text):
        parts.append(next(g for g in m.groups() if g is not None))
    return tuple(parts)


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Dotted key path → the line (1-based) that sets it, for tables and plain keys; the
    entries of an array of tables ``[[link]]`` are ``("link", "1")``, ``("link", "2")``, ...

    A line scanner, not a parser: it runs only on text tomllib already accepted, and is used
    only to point at lines, so multi-line strings can at worst point one line off."""
    out: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    items: dict[tuple[str, ...], int] = {}  # [[name]] seen so far: its entries are name.1, name.2, ...
    for n, line in enumerate(text.splitlines(), 1):
        m = _TABLE.match(line)
        if m:
            table = _split_key(m.group(1))
            out.setdefault(table, n)
            if line.lstrip().startswith("[["):
                items[table] = items.get(table, 0) + 1
                table = (*table, str(items[table]))
                out.setdefault(table, n)
            continue
        m = _KEY.match(line)
        if m:
            out.setdefault(table + _split_key(m.group(1)), n)
    return out


def locator(path: Path, text: str) -> Callable[[tuple[str, ...]], str]:
    """``file:line`` of a key in one TOML text (or of its table, or just the file): the
    ``where`` of almaboard.fields.check for a reader that parsed the text itself."""
    lines = key_lines(text)

    def where(key: tuple[str, ...]) -> str:
        for n in range(len(key), 0, -1):
            if key[:n] in lines:
                return f"{path}:{lines[key[:n]]}"
        return str(path)

    return where


def _merge(dst: dict[str, Any], src: dict[str, Any]) -> None:
    for key, val in src.items():
        if isinstance(val, dict) and isinstance(dst.get(key), dict):
            _merge(dst[key], val)
        else:
            dst[key] = val


@dataclass
class Layers:
    """The merged data of every file read, and where each key came from."""

    main: Path
    data: dict[str, Any] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    origin: dict[tuple[str, ...], tuple[Path, int]] = field(default_factory=dict)

    def where(self, *key: str) -> str:
        """``file:line`` of the (last) file that set ``key``, or of its table, or the main file."""
        for n in range(len(key), 0, -1):
            hit = self.origin.get(tuple(key[:n]))
            if hit:
                return f"{hit[0]}:{hit[1]}"
        return str(self.files[-1] if self.files else self.main)

    def locate(self, key: tuple[str, ...]) -> str:
        """:meth:`where` taking the key as one tuple (the ``where`` of almaboard.fields.check)."""
        return self.where(*key)

    def error(self, key: tuple[str, ...], message: str, hint: str | None = None) -> ConfigError:
        return ConfigError(f"{self.where(*key)}: {message}", hint=hint)


def load_layers(main: Path, *, dropins: bool = True) -> Layers:
    """``main`` plus ``<main stem>.d/*.toml`` merged in order (``dropins=False``: ``main`` only).
    A missing file is skipped: the caller decides whether no file at all means defaults."""
    layers = Layers(main)
    extra = sorted((main.parent / f"{main.stem}.d").glob("*.toml")) if dropins and main.parent.is_dir() else []
    for path in [main, *extra]:
        if not path.is_file():
            continue
        text = read_text(path, what="TOML file", hint=f"fix {path} (or move it away to use defaults)",
                         max_bytes=MAX_CONFIG_BYTES)  # fmt: skip
        data = loads_toml(text, path, hint=f"fix the TOML in {path} (or move it away to use defaults)")
        _merge(layers.data, data)
        layers.files.append(path)
        for key, line in key_lines(text).items():
            layers.origin[key] = (path, line)
    return layers


def load_toml_layers(main: Path) -> tuple[dict[str, Any], list[Path]]:
    """The merged data and the files read (for callers that need no line numbers)."""
    layers = load_layers(main)
    return layers.data, layers.files
