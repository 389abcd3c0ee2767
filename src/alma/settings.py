"""Where things are: repository root, tool binaries, default directories.

Binary paths come from ``alma.toml`` (``[tools]`` table) or ``ALMA_TOOL_<NAME>``, with the
bare name as default, so a lab can point ``initrd-flash`` or ``kas`` somewhere else.

Run as root (``sudo alma flash``), or in a checkout that is not the runner's own, every
one of these places must be out of other users' reach (alma.flash.privilege, invariant 4):
a project root, ``alma.toml`` or tool path another user can write or own is refused with
its owner, mode and the fix, never silently used or skipped.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

from alma import loader


def repo_root(start: Path | None = None) -> Path:
    """The project checkout: the nearest parent holding ``kas/`` and ``layers/``.

    ``ALMA_ROOT`` overrides; falls back to the current directory.
    """
    env = os.environ.get("ALMA_ROOT")
    if env:
        return _trusted_root(Path(env).resolve(), "ALMA_ROOT")
    here = (start or Path.cwd()).resolve()
    for cand in (here, *here.parents):
        if (cand / "kas").is_dir() and (cand / "layers").is_dir():
            return _trusted_root(cand, "project root (found above the current directory)")
    return _trusted_root(here, "project root (the current directory)")


def _trusted_root(root: Path, what: str) -> Path:
    from alma.flash.privilege import trusted_config

    return trusted_config(
        root,
        what,
        "run alma from (or set ALMA_ROOT to) a checkout that only you "
        "(or root) can write, e.g. cd /root/alma-os; never from a directory another user controls",
    )


@cache
def _config(root: Path) -> dict[str, object]:
    path = root / "alma.toml"
    if not path.exists():
        return {}
    from alma.flash.privilege import trusted_config

    trusted_config(path, "alma.toml", f"make {path} yours (chown, chmod go-w) or remove it")
    return loader.load_toml(path, hint=f"fix {path} (TOML, UTF-8)")


def config(root: Path | None = None) -> dict[str, object]:
    return _config(root or repo_root())


def tool(name: str, root: Path | None = None) -> str:
    """The command to run for external tool ``name`` (default: the bare name)."""
    env_key = "ALMA_TOOL_" + name.upper().replace("-", "_")
    if os.environ.get(env_key):
        return _trusted_tool(os.environ[env_key], f"{env_key}")
    tools = config(root).get("tools", {})
    if isinstance(tools, dict) and isinstance(tools.get(name), str):
        return _trusted_tool(str(tools[name]), f"alma.toml [tools] {name}")
    return name


def _trusted_tool(value: str, what: str) -> str:
    """A configured path is checked like the project root (a bare name is looked up in PATH)."""
    if "/" not in value:
        return value
    from alma.flash.privilege import trusted_config

    return str(trusted_config(Path(value), what, "point it at a program only root (or you) can write"))
