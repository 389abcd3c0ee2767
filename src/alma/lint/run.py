"""Everything ``alma lint`` checks, in one call: kas files, pins, oelint-adv, layer checks."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alma.errors import UserError
from alma.lint.findings import Finding


@dataclass
class Report:
    root: Path
    findings: list[Finding] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "findings": [f.to_dict() for f in sorted(self.findings)],
            "checked": self.checked,
            "skipped": self.skipped,
        }


def layers(root: Path) -> list[Path]:
    return sorted(p.parent.parent for p in (root / "layers").glob("*/conf/layer.conf"))


def _fabric_checker() -> Callable[[Path], list[Finding]] | None:
    # H5's checker lands separately; lint works with or without it.
    try:
        mod = importlib.import_module("alma.lint.fabric")
    except ModuleNotFoundError as exc:
        if exc.name == "alma.lint.fabric":
            return None
        raise
    check = getattr(mod, "check_layer", None)
    return check if callable(check) else None


def _quiet(step: str) -> None:
    return None


def lint(root: Path, *, oelint: bool = True, progress: Callable[[str], None] = _quiet) -> Report:
    """Raise UserError (exit 2) when the project cannot be linted at all.

    ``progress`` is told each step before it starts (the CLI prints it at once: oelint-adv
    takes tens of seconds, and a silent command looks hung)."""
    progress("loading kas (its schema is the reference)")
    try:
        import kas  # noqa: F401  (its schema is the reference)
    except ImportError as exc:
        raise UserError(
            "kas is not importable, so kas files cannot be checked", hint=".venv/bin/pip install -e ."
        ) from exc
    from alma.lint import kasfiles
    from alma.lint import oelint as oel

    kas_dir = root / "kas"
    if not kas_dir.is_dir():
        raise UserError(
            f"{kas_dir}: no kas/ directory; is {root} an ALMA-OS checkout?",
            hint="run alma lint in the checkout, or set ALMA_ROOT",
        )
    report = Report(root)
    files = kasfiles.kas_files(kas_dir)
    if not files:
        raise UserError(f"{kas_dir}: no kas files (*.yml) to check", hint="restore kas/alma.yml from git")
    progress(f"checking {len(files)} kas files (schema, includes, pins)")
    report.findings += kasfiles.check_checkout(root)
    report.findings += kasfiles.check_files(root, files)
    report.findings += kasfiles.check_pins(files)
    report.checked["kas_files"] = len(files)

    found_layers = layers(root)
    if not found_layers:
        raise UserError(
            f"{root / 'layers'}: no layer (layers/*/conf/layer.conf) to check", hint="restore layers/meta-alma from git"
        )
    fabric = _fabric_checker()
    if fabric is None:
        report.skipped.append("fabric (alma.lint.fabric not installed)")
    n_files = 0
    for layer in found_layers:
        if oelint:
            rel = layer.relative_to(root) if layer.is_relative_to(root) else layer
            progress(f"running oelint-adv on {rel} ({len(oel.layer_files(layer))} files; this takes a while)")
            report.findings += oel.check_layer(layer)
            n_files += len(oel.layer_files(layer))
        if fabric is not None:
            report.findings += fabric(layer)
    report.checked["layers"] = len(found_layers)
    report.checked["layer_files"] = n_files
    return report
