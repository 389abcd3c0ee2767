"""The board layout (tools/board-layout.toml): what the image installs where, read once.

The same file drives the virtual board's assembly (:func:`install`) and is held against the
recipes by tests/lab/test_layout.py.
"""

from __future__ import annotations

import os
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alma.errors import ConfigError
from alma.settings import repo_root

LAYOUT = "tools/board-layout.toml"
SITE_PACKAGES = "/usr/lib/python3/dist-packages"  # the board's interpreter (Debian's here)
PYTHON = "/usr/bin/python3"


@dataclass(frozen=True)
class User:
    recipe: str
    name: str
    system: bool
    home: str
    shell: str
    groups: tuple[str, ...]


@dataclass(frozen=True)
class File:
    recipe: str
    src: str
    dest: str
    mode: int


@dataclass(frozen=True)
class Generated:
    """A file a recipe writes from the build's settings (``source``: the variable, or
    ``printf`` for one it composes), not from the tree."""

    recipe: str
    dest: str
    mode: int
    source: str


@dataclass(frozen=True)
class Link:
    recipe: str
    dest: str
    target: str


@dataclass(frozen=True)
class Unit:
    recipe: str
    name: str
    enabled: bool


@dataclass(frozen=True)
class Mask:
    recipe: str
    unit: str


@dataclass(frozen=True)
class Python:
    recipe: str
    tree: str

    def packages(self, root: Path) -> list[Path]:
        """The package directories of the tree (each with an __init__.py)."""
        tree = root / self.tree
        return sorted(p.parent for p in tree.glob("*/__init__.py"))

    def scripts(self, root: Path) -> dict[str, str]:
        """[project.scripts]: command name -> "module:function"."""
        data = tomllib.loads((root / self.tree / "pyproject.toml").read_text())
        return dict(data.get("project", {}).get("scripts", {}))


@dataclass(frozen=True)
class Layout:
    users: tuple[User, ...]
    files: tuple[File, ...]
    links: tuple[Link, ...]
    units: tuple[Unit, ...]
    python: tuple[Python, ...]
    masks: tuple[Mask, ...] = ()
    generated: tuple[Generated, ...] = ()


def root() -> Path:
    return repo_root(Path(__file__).resolve().parent)


def load(path: Path | None = None) -> Layout:
    path = path or root() / LAYOUT
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text())
        return Layout(
            users=tuple(
                User(u["recipe"], u["name"], bool(u["system"]), u["home"], u["shell"], tuple(u["groups"]))
                for u in data.get("user", [])
            ),
            files=tuple(File(f["recipe"], f["src"], f["dest"], int(f["mode"], 8)) for f in data.get("file", [])),
            links=tuple(Link(k["recipe"], k["dest"], k["target"]) for k in data.get("link", [])),
            units=tuple(Unit(u["recipe"], u["name"], bool(u["enabled"])) for u in data.get("unit", [])),
            python=tuple(Python(p["recipe"], p["tree"]) for p in data.get("python", [])),
            masks=tuple(Mask(m["recipe"], u) for m in data.get("mask", []) for u in m["units"]),
            generated=tuple(
                Generated(g["recipe"], g["dest"], int(g["mode"], 8), g["source"]) for g in data.get("generated", [])
            ),
        )
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: not a board layout ({exc})", hint="restore it from git") from None


def board_state_paths(layout: Layout, src_root: Path | None = None) -> list[str]:
    """Paths that are the board's alone: its configuration directories and every unit's
    StateDirectory= (and DynamicUser's /var/lib/private). The host's copies (its own runs of
    these programs) must not show through the board's lower layer."""
    src_root = src_root or root()
    paths = {"/data", "/var/lib/private"}
    for f in layout.files:
        if f.dest.startswith("/etc/") and f.dest.count("/") == 3:
            paths.add(f.dest.rsplit("/", 1)[0])  # /etc/alma, /etc/eran-grid
        if f.dest.startswith("/usr/lib/systemd/system/"):
            for line in (src_root / f.src).read_text().splitlines():
                if line.startswith("StateDirectory="):
                    paths.update(f"/var/lib/{d}" for d in line.split("=", 1)[1].split())
    return sorted(paths)


def _put(upper: Path, dest: str) -> Path:
    target = upper / dest.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    return target


def install(layout: Layout, upper: Path, src_root: Path | None = None) -> None:
    """Write the layout's files, links, packages and scripts into ``upper`` (the board's
    root as an overlay upper layer); every entry root-owned, as the recipes install them."""
    src_root = src_root or root()
    for f in layout.files:
        target = _put(upper, f.dest)
        shutil.copyfile(src_root / f.src, target)
        os.chmod(target, f.mode)
    for k in layout.links:
        target = _put(upper, k.dest)
        target.unlink(missing_ok=True)
        target.symlink_to(k.target)
    for m in layout.masks:
        target = _put(upper, f"/etc/systemd/system/{m.unit}")
        target.unlink(missing_ok=True)
        target.symlink_to("/dev/null")
    site = upper / SITE_PACKAGES.lstrip("/")
    for py in layout.python:
        for pkg in py.packages(src_root):
            dest = site / pkg.name
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(pkg, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for name, entry in py.scripts(src_root).items():
            module, func = entry.split(":")
            target = _put(upper, f"/usr/bin/{name}")
            target.write_text(f"#!{PYTHON}\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n")
            os.chmod(target, 0o755)
    # Site-packages and scripts: root-owned, world-readable, as a package manager leaves them.
    for dirpath, dirs, files in os.walk(site):
        for d in dirs:
            os.chmod(os.path.join(dirpath, d), 0o755)
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o644)


def unit_wants(upper: Path, unit: str) -> str | None:
    """The [Install] WantedBy= target of an installed unit (what its enablement links into)."""
    text = (upper / "usr/lib/systemd/system" / unit).read_text()
    for line in text.splitlines():
        if line.startswith("WantedBy="):
            return line.split("=", 1)[1].split()[0]
    return None
