"""Where things are: repository root, tool binaries, default directories.

Binary paths come from ``alma.toml`` (``[tools]`` table) or ``ALMA_TOOL_<NAME>``, with the
bare name as default, so a lab can point ``initrd-flash`` or ``kas`` somewhere else.
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
        return Path(env).resolve()
    here = (start or Path.cwd()).resolve()
    for cand in (here, *here.parents):
        if (cand / "kas").is_dir() and (cand / "layers").is_dir():
            return cand
    return here


@cache
def _config(root: Path) -> dict[str, object]:
    path = root / "alma.toml"
    if not path.exists():
        return {}
    return loader.load_toml(path, hint=f"fix {path} (TOML, UTF-8)")


def config(root: Path | None = None) -> dict[str, object]:
    return _config(root or repo_root())


def tool(name: str, root: Path | None = None) -> str:
    """The command to run for external tool ``name`` (default: the bare name)."""
    env_key = "ALMA_TOOL_" + name.upper().replace("-", "_")
    if os.environ.get(env_key):
        return os.environ[env_key]
    tools = config(root).get("tools", {})
    if isinstance(tools, dict) and isinstance(tools.get(name), str):
        return str(tools[name])
    return name
