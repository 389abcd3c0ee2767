"""Virtual boards for tests (alma.lab, docs/lab.md): the image's userland booted under real
systemd with systemd-nspawn. Needs root and systemd-container: skipped without them locally,
a failure under CI=true.

``virtual_lab(count)`` starts ``count`` boards with names and ports unique to the test worker
(xdist) and takes them down (no mount, process or file left) when the block ends;
``virtual_fleet(count)`` adds the fleet file; ``lab_board`` is one booted board shared by
a test module. ``sh(board, ...)`` runs a command inside a board as root.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import IN_CI, require_tool

from alma.lab import board as lab

WAIT_S = 120.0  # effects under load: generous, returns as soon as they hold


def require_lab() -> None:
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("virtual boards need root (systemd-nspawn, mounts): run .ci/run as root")
        pytest.skip("virtual boards need root (systemd-nspawn, mounts): run the tests as root")
    require_tool("systemd-nspawn")
    require_tool("sudo")
    require_tool("sshd")


@contextlib.contextmanager
def virtual_lab(
    count: int = 1, ota_cert: bytes | None = None, image_sshd: bool = False, cpus: float | None = None
) -> Iterator[tuple[Path, list[lab.Board]]]:
    """``ota_cert``: the certificate the boards' image bakes in (default: the lab makes its
    own pair, ``<lab>/ota-cert.pem`` and ``ota-key.pem``). ``image_sshd``: the boards run
    sshd as the image does (alma.lab.board.use_image_sshd). ``cpus``: each board's own CPU
    budget (`alma lab up --cpus`), None: they share the host's cores."""
    require_lab()
    lab_dir = Path(tempfile.mkdtemp(prefix="alma-lab-"))
    prefix = f"t{uuid.uuid4().hex[:8]}-"  # machine names are host-wide: unique per test
    if ota_cert is not None:
        (lab_dir / lab.OTA_CERT).write_bytes(ota_cert)
    try:
        made = lab.up(lab_dir, count, prefix, image_sshd=image_sshd, cpus=cpus)
        yield lab_dir, [b for b, _ in made]
    finally:
        lab.down(lab_dir)
        assert not lab_dir.exists(), f"alma lab down left {sorted(p.name for p in lab_dir.iterdir())}"


@contextlib.contextmanager
def virtual_fleet(
    count: int = 2, ota_cert: bytes | None = None, image_sshd: bool = False, cpus: float | None = None
) -> Iterator[tuple[Path, list[lab.Board]]]:
    """``count`` boards and a fleet file reaching them (what `alma lab up --fleet` writes),
    for `alma fleet ...` / `alma update --fleet FILE` against real systemd over real ssh."""
    with virtual_lab(count, ota_cert, image_sshd, cpus) as (lab_dir, boards):
        fleet = lab_dir / "fleet.toml"
        fleet.write_text(lab.fleet_toml(lab_dir))
        try:
            yield fleet, boards
        finally:
            fleet.unlink(missing_ok=True)  # the lab directory goes with the boards


def wait_for(what: str, check: Callable[[], object], timeout: float = WAIT_S) -> object:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.1)


def sh(b: lab.Board, *argv: str, check: bool = True, timeout: float = 60) -> str:
    """Run a command inside the board as root; its output."""
    return "\n".join(b.exec(list(argv), check=check, timeout=timeout).lines)


def journal(b: lab.Board, unit: str, lines: int = 80) -> str:
    """The tail of a unit's journal inside the board: what a failing wait shows."""
    out = sh(b, "journalctl", "-o", "short-precise", "--no-pager", "-n", str(lines), "-u", unit, check=False)
    return f"journal of {unit}:\n{out}"


@pytest.fixture(scope="module")
def lab_board() -> Iterator[lab.Board]:
    with virtual_lab(1) as (_, boards):
        yield boards[0]
