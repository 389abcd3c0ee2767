"""The status label of a manifest's bundle, derived from flash records (never typed).

``Prototype`` (built, never flashed), ``Flashed`` (a record for this bundle's sha256 says
SUCCESS), ``Booted`` (such a record also saw the board boot). The one rule lives in
``alma.flash.records.status_label``; this only applies it to a manifest.
"""

from __future__ import annotations

from pathlib import Path

from alma.artefacts.manifest import STATUS_FACTS, Manifest
from alma.flash import records


def records_dir(facts_dir: Path) -> Path:
    """Flash records live next to the manifests: ``facts/flash-records/``."""
    return facts_dir / records.DEFAULT_DIR.name


def derive_status(manifest: Manifest, facts_dir: Path) -> None:
    """Set flashed/booted/status from the records in ``facts_dir/flash-records``.

    No bundle sha256 (nothing built/verified) -> all three null: there is nothing to label.
    """
    sha = manifest.facts["bundle_sha256"].value if manifest.has("bundle_sha256") else None
    rdir = records_dir(facts_dir)
    if not sha:
        for name in STATUS_FACTS:
            manifest.set(name, None, "no bundle sha256 in the manifest: nothing to label")
        return
    recs = records.load_all(rdir)
    mine = [r for r in recs if r.bundle_sha256 == sha]
    label = records.status_label(sha, recs)
    src = f"{rdir}: {len(mine)} flash record(s) for bundle sha256 {sha[:12]} (alma.flash.records.status_label)"
    manifest.set("status", label, src)
    manifest.set("flashed", label in ("Flashed", "Booted"), src)
    manifest.set("booted", label == "Booted", src)
