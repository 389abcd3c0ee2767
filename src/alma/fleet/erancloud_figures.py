"""ERANCLOUD's honest figures for ``alma panel``, drawn from the coordinator's status.json
(schema ``erancloud.status/1``, written by ``eran-cloud coordinator``), never typed by hand.

Live workers, registered workers and dry-run runs stay three separate figures: a dry run is
never shown as a worker, a worker that registered once is not shown as live. The file is
hostile input like any other: every field is type- and range-checked, and a bad file is a
ConfigError (exit 2) naming the field, so the page is not written with invented numbers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from alma.errors import ConfigError
from alma.fleet.inventory import Figure

SCHEMA = "erancloud.status/1"
MAX_BYTES = 1024 * 1024
COUNT_MAX = 10_000_000


def _count(data: dict[str, Any], key: str, path: Path) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= COUNT_MAX:
        raise ConfigError(f"{path}: {key!r} must be a whole number 0..{COUNT_MAX}, not {value!r:.40}",
                          hint="point --erancloud-status at the coordinator's status.json")  # fmt: skip
    return value


def load(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"cannot read ERANCLOUD status {path}: {exc.strerror}",
            hint="run eran-cloud coordinator --status-file PATH, or drop --erancloud-status",
        ) from exc
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{path} is {len(raw)} bytes, more than a status file ever is")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ConfigError(f"{path} is not an {SCHEMA} file")
    return data


def figures(path: Path) -> tuple[Figure, ...]:
    """The panel's figures from one status.json."""
    data = load(path)
    live, registered, dry = (_count(data, k, path) for k in ("live_workers", "registered_workers", "dry_run_runs"))
    window = _count(data, "live_window", path)
    round_no, rounds = _count(data, "round", path), _count(data, "rounds", path)
    if live > registered:
        raise ConfigError(f"{path}: {live} live workers but only {registered} registered")
    acc = data.get("test_accuracy")
    if acc is not None and (isinstance(acc, bool) or not isinstance(acc, int | float) or not (0 <= acc <= 1)
                            or not math.isfinite(acc)):  # fmt: skip
        raise ConfigError(f"{path}: test_accuracy must be a fraction 0..1 or null, not {acc!r:.40}")
    return (
        Figure("ERANCLOUD live workers", str(live), f"(delta applied in the last {window} rounds)"),
        Figure("ERANCLOUD registered workers", str(registered)),
        Figure("ERANCLOUD dry-run runs", str(dry), "(not workers)"),
        Figure("ERANCLOUD round", f"{round_no} of {rounds}"),
        Figure("ERANCLOUD test accuracy", "n/a" if acc is None else f"{100 * acc:.1f}", "" if acc is None else "%"),
    )


def with_erancloud_figures(fleet: Any, path: Path) -> Any:
    """``fleet`` with ERANCLOUD's figures after the configured ones."""
    import dataclasses

    panel = dataclasses.replace(fleet.panel, figures=fleet.panel.figures + figures(path))
    return dataclasses.replace(fleet, panel=panel)
