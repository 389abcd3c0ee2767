"""The kas project on disk: machines, features, images, and the merged kas configuration.

Everything here is offline. Files are read and validated by :mod:`alma.imagebuild.kasfile`
(the loader ``alma lint`` uses too) and merged with kas's own include handler, so what
``alma build`` believes about the project is what kas will believe.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alma.buildtree import DEFAULT_IMAGE, DEFAULT_MACHINE
from alma.errors import ConfigError, UserError
from alma.imagebuild import kasfile

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

    def state(self) -> str | None:
        """What kas will find in this checkout, as kas 5.5 (repos.py ``Repo.checkout``) judges
        it: "dirty" (``git diff --stat`` prints anything: kas logs "dirty - no checkout" and
        builds the tree as it is, unless --force-checkout), or moved from the pinned commit
        (kas checks the pin out again). None when clean at its commit, or not a git checkout."""
        if not self.url or not self.checked_out:
            return None
        from alma import runner
        from alma.errors import AlmaError

        try:
            diff = runner.capture(["git", "diff", "--stat"], cwd=self.checkout_dir, check=False, stderr="separate")
            head = runner.capture(["git", "rev-parse", "HEAD"], cwd=self.checkout_dir, check=False, stderr="separate")
        except (AlmaError, OSError):
            return None
        if not diff.ok or not head.ok:
            return None
        at = head.lines[0].strip() if head.lines else ""
        moved = bool(self.commit) and at != self.commit
        where = f"at {at[:12]}, not the pinned {str(self.commit)[:12]}" if moved else "at its pinned commit"
        if diff.lines:
            changed = diff.lines[-1].strip()
            return (
                f"dirty ({changed}; {where}): kas logs 'dirty - no checkout' and builds it as it is; "
                "--force-checkout discards the changes and checks the pin out"
            )
        if moved:
            return f"{where}: kas checks the pin out again (--update also follows the branch head)"
        return None


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
        # images a dynamic layer adds (alma-image-swu, with meta-swupdate)
        names |= {p.stem.split("_", 1)[0] for p in self.root.glob("layers/*/dynamic-layers/*/recipes-*/images/*.bb")}
        return sorted(names)

    def require_layout(self) -> None:
        base = self.root / BASE_FILE
        if not base.is_file():
            raise UserError(
                f"{base}: the kas base file is missing; is {self.root} an ALMA-OS checkout?",
                hint="run alma from the repository checkout, or set ALMA_ROOT=/path/to/checkout",
            )

    def vcs_problem(self) -> tuple[str, str] | None:
        """(what, fix) when the checkout is not a git or hg working tree, else None.

        kas takes the repository root of the first kas file (``git rev-parse --show-toplevel``,
        then ``hg root``) as the base of every include and of the layer repo ``meta-alma``;
        outside a repository it falls back to ``kas/`` itself and stops with "Configuration
        file not found" (kas 5.5 ``includehandler``/``repos.Repo.get_root_path``).
        """
        if any((self.root / marker).exists() for marker in (".git", ".hg")):
            return None
        return (
            f"{self.root} is not a git (or hg) checkout: kas resolves includes and the meta-alma layer from "
            "the repository root, and outside a repository it stops with 'Configuration file not found'",
            f"git -C {self.root} init -q && git -C {self.root} add -A  (or work in a git clone of the project)",
        )

    def machine_file(self, machine: str) -> Path:
        # A name is one of the files listed, never a path fragment ("../x" would reach outside).
        machines = self.machines()
        if machine not in machines:
            valid = ", ".join(machines) or "(none: kas/machines/ is empty)"
            raise UserError(
                f"unknown machine {machine!r}; valid machines: {valid}",
                hint=f"alma build --machine {machines[0] if machines else DEFAULT_MACHINE}",
            )
        return self.root / MACHINES_DIR / f"{machine}.yml"

    def feature_file(self, feature: str) -> Path:
        features = self.features()
        if feature not in features:
            valid = ", ".join(features) or "(none)"
            raise UserError(f"unknown feature {feature!r}; valid features: {valid}", hint="alma build --help")
        return self.root / FEATURES_DIR / f"{feature}.yml"

    def check_image(self, image: str) -> None:
        images = self.images()
        if image not in images:
            valid = ", ".join(images) or "(none: no layers/*/recipes-*/images/*.bb)"
            raise UserError(
                f"unknown image {image!r}; valid images: {valid}",
                hint=f"alma build --image {images[0] if images else DEFAULT_IMAGE}",
            )

    def extra_kas_files(self, specs: tuple[str, ...]) -> list[Path]:
        """``--kas-file a.yml:b.yml`` (kas's colon list; repeatable), checked by the same loader as
        every kas file. kas merges files of one repository only (IncludeHandler
        ensure_from_same_repo), so each must be inside this checkout."""
        out: list[Path] = []
        for spec in specs:
            for part in spec.split(":"):
                if not part:
                    continue
                path = (self.root / part if not Path(part).is_absolute() else Path(part)).resolve()
                if not path.is_file():
                    raise UserError(f"--kas-file {part}: not found", hint="alma build --kas-file kas/my.yml")
                if not path.is_relative_to(self.root.resolve()):
                    raise UserError(
                        f"--kas-file {part}: outside the checkout {self.root}; kas merges files of one repository only",
                        hint=f"put it under {self.root} (e.g. kas/local/{path.name}, ignored by git if you like)",
                    )
                out.append(self.root / path.relative_to(self.root.resolve()))
        return out

    def kas_files(self, machine: str, features: tuple[str, ...] = ()) -> list[Path]:
        """The files joined with ':' for kas: base, machine, then features in order."""
        self.require_layout()
        files = [self.root / BASE_FILE, self.machine_file(machine)]
        files += [self.feature_file(f) for f in features]
        return files


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
    """Validate the chain (each file, its includes, the machine) and merge it like kas does.

    Raises ConfigError listing every problem with ``path:line`` (the same ones ``alma lint``
    reports: both use :mod:`alma.imagebuild.kasfile`).
    """
    from kas.includehandler import IncludeHandler, KasUserError

    chain = kasfile.load_chain(project.root, files)
    problems = list(chain.problems)
    machine_files = [f for f in files if f.resolve().parent == (project.root / MACHINES_DIR).resolve()]
    if machine_files and not problems:
        problems += kasfile.machine_problems(project.root, machine_files[0], chain)
    if problems:
        _raise_problems(project, problems)

    class _OfflineIncludes(IncludeHandler):
        # kas asks git for the repo root of every top file (needs a kas context);
        # our top files all live under project.root/kas by construction.
        def ensure_from_same_repo(self) -> None:
            return None

    # safe to hand to kas now: every file is bounded, schema-valid and its includes resolve
    handler = _OfflineIncludes([str(f) for f in files], use_lock=True)
    handler.__dict__["top_repo_path"] = str(project.root)
    kas_log = logging.getLogger()
    level = kas_log.level
    kas_log.setLevel(logging.CRITICAL)
    try:
        data, missing = handler.get_config()
    except KasUserError as exc:
        raise ConfigError(f"kas: {exc}", hint="alma lint") from exc
    finally:
        kas_log.setLevel(level)
    if missing:
        raise ConfigError(
            f"kas files include files from repositories that are not checked out: {', '.join(missing)}",
            hint="alma build --check (checks them out), or include only files of this repository",
        )
    return KasConfig(files=files, data=data, loaded=[Path(cf.filename) for cf in handler.config_files])


def _raise_problems(project: Project, problems: list[kasfile.KasProblem]) -> None:
    lines = []
    for p in sorted(set(problems)):
        try:
            shown: Path = p.path.resolve().relative_to(project.root.resolve())
        except ValueError:
            shown = p.path
        lines.append(f"{shown}:{p.line}: {p.message}")
    raise ConfigError(
        "kas files are invalid:\n  " + "\n  ".join(lines),
        hint="fix the lines above (kas reference: https://kas.readthedocs.io), then: alma lint",
    )
