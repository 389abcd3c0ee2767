"""Cache of expensive per-file results (bundle sha256 + members, kernel banner), keyed by
(real path, size, mtime_ns, inode): any rewrite or replacement of the file misses.

Lives in ``$XDG_CACHE_HOME/alma/verify-cache.json`` (default ``~/.cache/alma``). A corrupt
cache is ignored and rewritten (it is only a cache); writes are atomic.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from alma import loader
from alma.errors import ConfigError
from alma.ground import write_atomic

VERSION = 1


def default_cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "alma" / "verify-cache.json"


def file_key(path: Path, kind: str) -> str:
    st = path.stat()
    return f"{kind}:{path.resolve()}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


class Cache:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_cache_file()
        self._data: dict[str, Any] | None = None
        self._dirty = False

    def _load(self) -> dict[str, Any]:
        if self._data is None:
            try:
                data = loader.load_json(self.path)  # finite numbers only, like every input
                ok = isinstance(data, dict) and data.get("version") == VERSION and isinstance(data.get("entries"), dict)
                self._data = data if ok else {"version": VERSION, "entries": {}}
            except ConfigError:  # missing, unreadable or corrupt: it is only a cache
                self._data = {"version": VERSION, "entries": {}}
        return self._data

    def get(self, key: str) -> dict[str, Any] | None:
        entry = self._load()["entries"].get(key)
        return entry if isinstance(entry, dict) else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        entries = self._load()["entries"]
        # Drop entries for the same path with an older stat: they can never hit again.
        prefix = key.rsplit(":", 3)[0] + ":"
        for k in [k for k in entries if k.startswith(prefix)]:
            del entries[k]
        entries[key] = value
        self._dirty = True

    def save(self) -> None:
        if self._dirty and self._data is not None:
            # An unwritable cache only costs time on the next run.
            with contextlib.suppress(OSError):
                write_atomic(self.path, json.dumps(self._data, indent=1, sort_keys=True) + "\n")
            self._dirty = False
