"""The facts manifest: ``facts/<image>-<machine>.json`` (schema ``alma.facts/1``).

Written by ``alma verify``, read by ``alma gates check`` and by ``alma flash`` (the expected
bundle sha256). Every fact is ``{"value": ..., "source": ...}`` so a reader can always say
where a value came from. Format: docs/formats.md#facts-manifest.

Stable API (other parts import it): ``manifest_path``, ``load_manifest``, ``Manifest.fact``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alma import loader
from alma.artefacts.rootfs import COMPONENTS
from alma.errors import ConfigError
from alma.ground import parse_utc, utc_iso

SCHEMA = "alma.facts/1"
FACTS_DIR = Path("facts")

# Every fact a manifest carries and its kind: the one list (alma verify writes them, the
# gate claims are judged by kind, the loader checks types). docs/formats.md#facts-manifest.
FACT_KINDS: dict[str, str] = {
    "image_buildable": "bool",
    "kernel_version": "version",
    "kernel_banner": "text",
    "kernel_image_bytes": "size",
    "kernel_image_path": "text",
    "kernel_package": "text",
    "bundle_bytes": "size",
    "bundle_sha256": "sha",
    "bundle_path": "text",
    "rootfs_bytes": "size",
    "rootfs_path": "text",
    "build_time": "time",
    "env_machine": "text",
    "env_chipid": "text",
    "env_rootfs_device": "text",
    "env_bootdev": "text",
    "package_count": "int",
    "components": "components",
    # supply chain (alma.artefacts.sbom): SPDX SBOM and cve-check, null when the build wrote none
    "sbom_format": "text",
    "sbom_package_count": "int",
    "licences": "data",
    "licence_proprietary": "data",
    "licence_unknown": "data",
    "cve_package_count": "int",
    "cve_counts": "data",
    "cve_unpatched_critical": "int",
    "cve_unpatched_high": "int",
    "cve_unpatched": "data",
    "cve_ignored": "data",
    "cve_ignored_without_detail": "data",
    "cve_blind_spots": "data",
    "cve_blind_spots_critical": "data",
    "nvd_data_date": "time",
    # derived from the flash records (alma.artefacts.status), never read from artefacts
    "flashed": "bool",
    "booted": "bool",
    "status": "label",
}
STATUS_FACTS = ("flashed", "booted", "status")
LABELS = ("Prototype", "Flashed", "Booted")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_time(v: Any) -> bool:
    try:
        parse_utc(v)
    except ValueError:
        return False
    return True


_VALID: dict[str, tuple[str, Any]] = {
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "size": ("a whole number of bytes (>= 0)", lambda v: _is_int(v) and v >= 0),
    "int": ("a whole number (>= 0)", lambda v: _is_int(v) and v >= 0),
    "version": ("a version string", lambda v: isinstance(v, str)),
    "text": ("a string", lambda v: isinstance(v, str)),
    "sha": ("64 lowercase hex digits", lambda v: isinstance(v, str) and _SHA256.fullmatch(v) is not None),
    "time": ("an ISO 8601 time with a zone", _is_time),
    "label": (" or ".join(LABELS), lambda v: v in LABELS),
    "data": ("a JSON object or list", lambda v: isinstance(v, dict | list)),
    "components": (
        "a mapping of ALMA component -> true/false",
        lambda v: isinstance(v, dict) and all(isinstance(k, str) and isinstance(b, bool) for k, b in v.items()),
    ),
}


def fact_type_error(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be fact ``name`` (None: it can; null is always "unknown")."""
    kind = FACT_KINDS.get(name)
    if kind is None or value is None:
        return None
    want, ok = _VALID[kind]
    if not ok(value):
        shown = json.dumps(value)[:60]
        return f"fact {name!r} is {shown}, want {want} (or null)"
    if kind == "components":
        unknown = sorted(set(value) - set(COMPONENTS))
        if unknown:
            return f"fact 'components' names unknown component(s) {', '.join(unknown)} (known: {', '.join(COMPONENTS)})"
    return None


@dataclass(frozen=True)
class Fact:
    value: Any
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source}


@dataclass
class Manifest:
    machine: str
    image: str
    facts: dict[str, Fact] = field(default_factory=dict)
    generated: str = ""
    path: Path | None = None  # where it was loaded from (None for a fresh one)
    schema: str = SCHEMA

    def fact(self, name: str) -> Fact:
        """The fact ``name`` (``.value``, ``.source``). A fact the manifest does not carry is an
        error, never a silent None: ``alma verify`` writes every known fact, with value null
        when it could not be established."""
        try:
            return self.facts[name]
        except KeyError:
            where = self.path or manifest_path(Path("."), self.image, self.machine)
            raise ConfigError(
                f"{where}: no fact {name!r} (has: {', '.join(sorted(self.facts)) or 'none'})",
                hint=f"alma verify --machine {self.machine} --image {self.image}",
            ) from None

    def value(self, name: str) -> Any:
        return self.fact(name).value

    def has(self, name: str) -> bool:
        return name in self.facts

    def set(self, name: str, value: Any, source: str) -> None:
        self.facts[name] = Fact(value, source)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "machine": self.machine,
            "image": self.image,
            "generated": self.generated or utc_iso(),
            "facts": {k: self.facts[k].to_dict() for k in sorted(self.facts)},
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"


def manifest_path(root: Path, image: str, machine: str) -> Path:
    """``<root>/facts/<image>-<machine>.json``."""
    return Path(root) / FACTS_DIR / f"{image}-{machine}.json"


def _bad(path: Path, why: str, hint: str | None = None) -> ConfigError:
    return ConfigError(
        f"{path}: {why}",
        hint=hint or f"regenerate it: alma verify  (writes {path}); facts manifests are never edited by hand",
    )


def parse_manifest(data: Any, path: Path) -> Manifest:
    if not isinstance(data, dict):
        raise _bad(path, "not a JSON object")
    if data.get("schema") != SCHEMA:
        raise _bad(path, f"schema is {data.get('schema')!r}, want {SCHEMA!r}")
    for key in ("machine", "image"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise _bad(path, f"missing or empty {key!r}")
    raw = data.get("facts")
    if not isinstance(raw, dict):
        raise _bad(path, "'facts' must be a mapping of name -> {value, source}")
    facts: dict[str, Fact] = {}
    for name, entry in raw.items():
        if not isinstance(entry, dict) or "value" not in entry or not isinstance(entry.get("source"), str):
            raise _bad(path, f"fact {name!r} must be {{'value': ..., 'source': '<where it came from>'}}")
        why = fact_type_error(name, entry["value"])
        if why:
            raise _bad(path, why)
        facts[name] = Fact(entry["value"], entry["source"])
    return Manifest(
        machine=data["machine"],
        image=data["image"],
        facts=facts,
        generated=str(data.get("generated", "")),
        path=path,
    )


def load_manifest(path: Path) -> Manifest:
    """Read and validate a facts manifest. Missing or malformed -> ConfigError with a hint."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise ConfigError(
            f"facts manifest not found: {path}",
            hint="alma verify [DEPLOY_DIR] --machine MACHINE --image IMAGE  (writes it)",
        )
    hint = f"regenerate it: alma verify  (writes {path}); facts manifests are never edited by hand"
    return parse_manifest(loader.load_json(path, hint=hint), path)


def find_manifests(root: Path) -> list[Path]:
    """Every facts manifest under ``<root>/facts`` (not the flash records)."""
    d = Path(root) / FACTS_DIR
    return sorted(p for p in d.glob("*.json") if p.is_file())
