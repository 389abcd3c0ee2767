"""The facts manifest: ``facts/<image>-<machine>.json`` (schema ``alma.facts/1``).

Written by ``alma verify``, read by ``alma gates check`` and by ``alma flash`` (the expected
bundle sha256). Every fact is ``{"value": ..., "source": ...}`` so a reader can always say
where a value came from. Format: docs/formats.md#facts-manifest.

Stable API (other parts import it): ``manifest_path``, ``load_manifest``, ``Manifest.fact``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alma.errors import ConfigError
from alma.ground import utc_iso

SCHEMA = "alma.facts/1"
FACTS_DIR = Path("facts")


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
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"facts manifest not found: {path}",
            hint="alma verify [DEPLOY_DIR] --machine MACHINE --image IMAGE  (writes it)",
        ) from None
    except OSError as exc:
        raise _bad(path, f"cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise _bad(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _bad(path, f"not valid JSON (line {exc.lineno}: {exc.msg})") from exc
    return parse_manifest(data, path)


def find_manifests(root: Path) -> list[Path]:
    """Every facts manifest under ``<root>/facts`` (not the flash records)."""
    d = Path(root) / FACTS_DIR
    return sorted(p for p in d.glob("*.json") if p.is_file())
