"""No shipped unit orders itself into a cycle with systemd's boot targets.

A service with default dependencies starts after basic.target, and every socket unit is
before sockets.target, itself before basic.target: such a service ordered Before= a socket
(or an early target) is a cycle, which systemd breaks by dropping a job of the boot
transaction. alma-ota-settle.service once had Before=sshd.socket: on the image's
per-connection sshd, systemd dropped sshd.socket's start and the board refused ssh."""

from __future__ import annotations

import configparser
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EARLY = {"sockets.target", "basic.target", "sysinit.target", "local-fs.target", "paths.target", "timers.target"}


def _units() -> list[Path]:
    found = [*REPO.glob("tools/*/systemd/*.service"), *REPO.glob("layers/meta-alma/**/*.service")]
    return sorted(set(found))


def _options(path: Path) -> dict[str, list[str]]:
    parser = configparser.ConfigParser(strict=False, interpolation=None, allow_no_value=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text())
    unit = parser["Unit"] if parser.has_section("Unit") else {}
    return {k: str(v or "").split() for k, v in unit.items()}


def test_no_unit_with_default_dependencies_is_ordered_before_a_socket_or_an_early_target() -> None:
    units = _units()
    assert any(p.name == "alma-ota-settle.service" for p in units)  # the set is really read
    bad = []
    for path in units:
        opts = _options(path)
        if opts.get("DefaultDependencies") == ["no"]:
            continue
        for target in opts.get("Before", []):
            if target.endswith(".socket") or target in EARLY:
                bad.append(f"{path.relative_to(REPO)}: Before={target}")
    assert bad == [], bad
