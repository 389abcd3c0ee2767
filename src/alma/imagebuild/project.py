"""The kas project on disk: machines, features, images, and the merged kas configuration.

Everything here is offline. Files are validated with kas's own schema and header-version
check (``kas.includehandler.ConfigFile.load``) and merged with kas's own include handler,
so what ``alma build`` believes about the project is what kas will believe.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alma.buildtree import DEFAULT_IMAGE, DEFAULT_MACHINE
from alma.errors import ConfigError, UserError

BASE_FILE = "kas/alma.yml"
MACHINES_DIR = "kas/machines"
FEATURES_DIR = "kas/features"

FULL_SHA = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class RepoPin:
    """One repository of the merged kas config, as kas will check it out."""

    repo_id: str
    url: str | None
    commit: str | None
    branch: str | None
    checkout_dir: Path

    @property
    def checked_out(self) -> bool:
        return (self.checkout_dir / ".git").exists()


@dataclass
class Project:
    root: Path

    @property
    def kas_dir(self) -> Path:
        return self.root / "kas"

    def machines(self) -> list[str]:
        return sorted(p.stem for p in (self.root / MACHINES_DIR).glob("*.yml"))

    def features(self) -> list[str]:
        return sorted(p.stem for p in (self.root / FEATURES_DIR).glob("*.yml"))

    def images(self) -> list[str]:
        # layers/<layer>/recipes-*/images/<name>[_<version>].bb
        names = {p.stem.split("_", 1)[0] for p in self.root.glob("layers/*/recipes-*/images/*.bb")}
        return sorted(names)

    def require_layout(self) -> None:
        base = self.root / BASE_FILE
        if not base.is_file():
            raise UserError(
                f"{base}: the kas base file is missing; is {self.root} an ALMA-OS checkout?",
                hint="run alma from the repository checkout, or set ALMA_ROOT=/path/to/checkout",
            )

    def machine_file(self, machine: str) -> Path:
        path = self.root / MACHINES_DIR / f"{machine}.yml"
        if not path.is_file():
            valid = ", ".join(self.machines()) or "(none: kas/machines/ is empty)"
            raise UserError(
                f"unknown machine {machine!r}; valid machines: {valid}",
                hint=f"alma build --machine {self.machines()[0] if self.machines() else DEFAULT_MACHINE}",
            )
        return path

    def feature_file(self, feature: str) -> Path:
        path = self.root / FEATURES_DIR / f"{feature}.yml"
        if not path.is_file():
            valid = ", ".join(self.features()) or "(none)"
            raise UserError(f"unknown feature {feature!r}; valid features: {valid}", hint="alma build --help")
        return path

    def check_image(self, image: str) -> None:
        images = self.images()
        if image not in images:
            valid = ", ".join(images) or "(none: no layers/*/recipes-*/images/*.bb)"
            raise UserError(
                f"unknown image {image!r}; valid images: {valid}",
                hint=f"alma build --image {images[0] if images else DEFAULT_IMAGE}",
            )

    def kas_files(self, machine: str, features: tuple[str, ...] = ()) -> list[Path]:
        """The files joined with ':' for kas: base, machine, then features in order."""
        self.require_layout()
        files = [self.root / BASE_FILE, self.machine_file(machine)]
        files += [self.feature_file(f) for f in features]
        return files


def yaml_line(path: Path, keys: list[Any]) -> int:
    """1-based line of the YAML node at ``keys`` (a jsonschema error path); 0 if unknown."""
    import yaml

    try:
        node = yaml.compose(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return 0
    line = node.start_mark.line + 1 if node is not None else 0
    for key in keys:
        if isinstance(node, yaml.MappingNode):
            for knode, vnode in node.value:
                if knode.value == str(key):
                    line = knode.start_mark.line + 1
                    node = vnode
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            return line
    return line


@dataclass(frozen=True)
class SchemaProblem:
    path: Path
    line: int
    message: str


def schema_problems(path: Path) -> list[SchemaProblem]:
    """Every kas-schema and header-version problem of one kas file, with line numbers.

    The schema errors come from iterating kas.CONFIGSCHEMA's validator ourselves (kas only
    logs them); the header-version verdict comes from kas's own ConfigFile.load.
    """
    import yaml
    from jsonschema.validators import validator_for
    from kas.includehandler import ConfigFile, LoadConfigException

    import kas

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        return [SchemaProblem(path, 0, f"cannot read: {exc.strerror}")]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        return [SchemaProblem(path, mark.line + 1 if mark else 0, f"not valid YAML: {exc}")]
    schema = vars(kas)["CONFIGSCHEMA"]  # set at import time by kas.configschema
    validator = validator_for(schema)(schema)
    problems = []
    for err in sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path))):
        err = _explain(err)
        keys = list(err.absolute_path)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            known = err.schema.get("properties", {})
            extra = [k for k in err.instance if k not in known]
            keys += extra[:1]  # point at the unexpected key itself
        where = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        problems.append(SchemaProblem(path, yaml_line(path, keys), f"kas schema: at {where}: {err.message}"))
    if problems:
        return problems
    kas_log = logging.getLogger()
    level = kas_log.level
    kas_log.setLevel(logging.CRITICAL)  # kas logs what we already report
    try:
        ConfigFile.load(str(path))
    except LoadConfigException as exc:
        msg = str(exc).replace(f": {path}", "")
        return [SchemaProblem(path, yaml_line(path, ["header", "version"]), f"kas header: {msg}")]
    finally:
        kas_log.setLevel(level)
    return []


def _explain(err: Any) -> Any:
    """The most telling sub-error of an anyOf/oneOf failure (kas's repo entries are
    "an object or null", so the raw message is just "not valid under any of the given schemas")."""
    while err.context:
        subs = [
            c
            for c in err.context
            if c.validator != "const" and not (c.validator == "type" and c.validator_value == "null")
        ]
        if not subs:
            break
        err = max(subs, key=lambda c: len(c.absolute_path))
    return err


@dataclass
class KasConfig:
    """The merged configuration of a chain of kas files (what kas itself computes)."""

    files: list[Path]
    data: dict[str, Any]
    loaded: list[Path] = field(default_factory=list)  # includes and lock files, in merge order

    def repos(self, work_dir: Path) -> list[RepoPin]:
        pins = []
        # kas lock files (and `overrides:` in general) pin commits outside `repos:`
        overrides = ((self.data.get("overrides") or {}).get("repos")) or {}
        for repo_id, spec in (self.data.get("repos") or {}).items():
            spec = spec or {}
            url = spec.get("url")
            commit = (overrides.get(repo_id) or {}).get("commit") or spec.get("commit")
            path = spec.get("path")
            if path is None:
                checkout = work_dir / str(spec.get("name") or repo_id)
            else:
                checkout = Path(path) if Path(path).is_absolute() else work_dir / path
            pins.append(RepoPin(repo_id, url, commit, spec.get("branch"), checkout))
        return pins


def load_kas(project: Project, files: list[Path]) -> KasConfig:
    """Validate each file of the chain (and its includes) and merge them like kas does.

    Raises ConfigError listing every schema problem with ``path:line``.
    """
    from kas.includehandler import IncludeHandler, KasUserError

    problems = [p for f in files for p in schema_problems(f)]
    if problems:
        _raise_schema(project, problems)

    class _OfflineIncludes(IncludeHandler):
        # kas asks git for the repo root of every top file (needs a kas context);
        # our top files all live under project.root/kas by construction.
        def ensure_from_same_repo(self) -> None:
            return None

    handler = _OfflineIncludes([str(f) for f in files], use_lock=True)
    handler.__dict__["top_repo_path"] = str(project.root)
    kas_log = logging.getLogger()
    level = kas_log.level
    kas_log.setLevel(logging.CRITICAL)
    try:
        data, missing = handler.get_config()
    except KasUserError as exc:
        # An included file failed: validate it on its own for a precise message.
        bad = [p for cf in _included_paths(str(exc)) for p in schema_problems(cf)]
        if bad:
            _raise_schema(project, bad)
        raise ConfigError(f"kas: {exc}", hint="alma lint") from exc
    finally:
        kas_log.setLevel(level)
    if missing:
        raise ConfigError(
            f"kas files include files from repositories that are not checked out: {', '.join(missing)}",
            hint="alma build --check (checks them out), or include only files of this repository",
        )
    return KasConfig(files=files, data=data, loaded=[Path(cf.filename) for cf in handler.config_files])


def _included_paths(message: str) -> list[Path]:
    # kas's messages end with ": <filename>"
    tail = message.rsplit(": ", 1)[-1].strip()
    return [Path(tail)] if tail.endswith((".yml", ".yaml", ".json")) and Path(tail).exists() else []


def _raise_schema(project: Project, problems: list[SchemaProblem]) -> None:
    lines = []
    for p in problems:
        try:
            shown: Path = p.path.resolve().relative_to(project.root.resolve())
        except ValueError:
            shown = p.path
        lines.append(f"{shown}:{p.line}: {p.message}")
    raise ConfigError(
        "kas files are invalid:\n  " + "\n  ".join(lines),
        hint="fix the keys above (kas reference: https://kas.readthedocs.io), then: alma lint",
    )
