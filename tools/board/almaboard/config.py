"""Layered TOML configuration with ``file:line`` errors.

``/etc/alma/guard.toml`` then ``/etc/alma/guard.d/*.toml`` in name order (per-board measured
values go in a drop-in such as ``guard.d/50-board.toml``); later files override earlier
ones key by key. A missing file means defaults; a broken one is a :class:`ConfigError`
naming ``file:line``. :class:`Layers` remembers where every key was set, so a value that
parses but is wrong (an unknown key, a negative hold-off) is reported at its line too.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

_TABLE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")
_KEY = re.compile(r"""^\s*("(?:[^"\\]|\\.)*"|'[^']*'|[A-Za-z0-9_.\-"' ]+?)\s*=""")
_LINE = re.compile(r"\(at line (\d+), column (\d+)\)")


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
        try:
            raw = path.read_bytes()
            text = raw.decode("utf-8")
            data = tomllib.loads(text)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}", hint=f"check the permissions of {path}") from exc
        except UnicodeDecodeError as exc:
            line = raw[: exc.start].count(b"\n") + 1
            raise ConfigError(f"{path}:{line}: not UTF-8", hint=f"save {path} as UTF-8") from exc
        except RecursionError:  # `a = [[[[...`: a few hundred levels exhaust tomllib's recursion
            raise ConfigError(
                f"{path}: not valid TOML: nested too deeply", hint=f"flatten {path} (or move it away to use defaults)"
            ) from None
        except tomllib.TOMLDecodeError as exc:
            m = _LINE.search(str(exc))
            where = f"{path}:{m.group(1)}" if m else str(path)
            msg = _LINE.sub("", str(exc)).strip()
            raise ConfigError(
                f"{where}: not valid TOML: {msg}", hint=f"fix the TOML in {path} (or move it away to use defaults)"
            ) from exc
        _merge(layers.data, data)
        layers.files.append(path)
        for key, line in key_lines(text).items():
            layers.origin[key] = (path, line)
    return layers


def load_toml_layers(main: Path) -> tuple[dict[str, Any], list[Path]]:
    """The merged data and the files read (for callers that need no line numbers)."""
    layers = load_layers(main)
    return layers.data, layers.files
