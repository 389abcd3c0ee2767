"""The facts a gate document is judged against: its manifest plus live status.

Status labels come from the flash records as they are *now* (facts/flash-records), not as
they were when the manifest was written: a doc claiming "Flashed" is stale the moment no
record backs it, and correct the moment ``alma flash`` records a success.
"""

from __future__ import annotations

from pathlib import Path

from alma.artefacts.manifest import Manifest, load_manifest
from alma.artefacts.status import derive_status
from alma.errors import ConfigError
from alma.gates.doc import GateDoc


class FactsStore:
    def __init__(self, root: Path, facts_dir: Path) -> None:
        self.root = root
        self.facts_dir = facts_dir
        self._cache: dict[Path, Manifest] = {}

    def path_for(self, doc: GateDoc) -> Path:
        """``facts:`` from the front matter (relative to the project root), else
        ``<facts dir>/<image>-<machine>.json``."""
        if doc.facts:
            p = Path(doc.facts)
            return p if p.is_absolute() else self.root / p
        return self.facts_dir / f"{doc.image}-{doc.machine}.json"

    def for_doc(self, doc: GateDoc) -> Manifest:
        path = self.path_for(doc)
        if path not in self._cache:
            m = load_manifest(path)
            if (m.machine, m.image) != (doc.machine, doc.image):
                raise ConfigError(
                    f"{path} is for {m.image}/{m.machine}, but {doc.path} claims about {doc.image}/{doc.machine}",
                    hint="fix machine:/image:/facts: in the document's front matter",
                )
            derive_status(m, self.facts_dir)
            self._cache[path] = m
        return self._cache[path]
