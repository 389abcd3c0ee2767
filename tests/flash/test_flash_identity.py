"""`alma flash` naming boards, through the real CLI, umockdev boards and the
flash simulator, which plays the device: it copies flashpkg-extra/ into its flash package and
runs the layer's real hook (dash) against each board's rootfs tree."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import require_tool
from support_flash import Station

from alma.flash.identity import CONF_REL

HOOK = Path(__file__).resolve().parents[2] / (
    "layers/meta-alma/dynamic-layers/tegra/recipes-core/initrdscripts/files/alma-board-identity"
)
# tests/flash/devices/three-boards.umockdev: an AGX Orin at 1-3 (refused: the bundle is for
# the Orin Nano) and two Orin Nanos. Numbers follow USB order over every board in recovery
# mode, so a board refused now gets the same name when it is flashed later.
BOARDS = ["1-3", "1-4", "1-8.4"]


def _ready(station: Station) -> Path:
    b = station.bundle()
    station.manifest(b)
    return b


def _device(tmp_path: Path) -> Path:
    dev = tmp_path / "device"
    for inst in BOARDS:
        etc = dev / inst / "rootfs" / "etc"
        etc.mkdir(parents=True)
        (etc / "hostname").write_text("jetson-orin-nano-devkit\n")
    return dev


def test_all_with_a_pattern_names_each_board_through_its_own_copy(station: Station, tmp_path: Path) -> None:
    require_tool("dash")
    _ready(station)
    dev = _device(tmp_path)
    r = station.alma("flash", "--yes", "--console", "none", "--all", "--hostname-pattern", "edge-{n:02d}",
                     "--keep-work", device="three-boards", SIM_DEVICE_DIR=str(dev), SIM_DEVICE_HOOKS=str(HOOK),
                     SIM_DEVICE_SHELL="dash")  # fmt: skip
    assert r.returncode == 2, r.stderr  # the AGX Orin was refused; the two Nanos flashed
    want = {"1-4": "edge-02", "1-8.4": "edge-03"}
    recs = {rec["board"]["usb_instance"]: rec for rec in station.records_list()}  # type: ignore[index]
    assert recs["1-3"]["result"] == "REFUSED"
    assert {k: recs[k]["identity"]["hostname"] for k in want} == want  # type: ignore[index]
    [run] = list(station.work.glob("run-*"))
    assert not (run / "bundle" / "flashpkg-extra").exists()  # the shared unpacked bundle stays clean
    for inst, name in want.items():
        copy = run / "boards" / inst
        extra = sorted(str(p.relative_to(copy)) for p in (copy / "flashpkg-extra").rglob("*"))
        assert extra == ["flashpkg-extra/alma", str(CONF_REL)]
        assert f"HOSTNAME={name}\n" in (copy / CONF_REL).read_text()
        # the device side ran the hook with that board's config, and only that one
        assert (dev / inst / "rootfs/etc/hostname").read_text() == f"{name}\n"


def test_one_hostname_for_several_boards_is_refused_before_any_flash(station: Station, tmp_path: Path) -> None:
    _ready(station)
    dev = _device(tmp_path)
    r = station.alma("flash", "--yes", "--console", "none", "--all", "--hostname", "edge-01", device="three-boards",
                     SIM_DEVICE_DIR=str(dev), SIM_DEVICE_HOOKS=str(HOOK))  # fmt: skip
    assert r.returncode == 2 and "every board would get the same name" in r.stderr
    assert {rec["result"] for rec in station.records_list()} == {"REFUSED"}
    assert not list(dev.rglob("flashpkg"))  # no device was reached
    assert station.leftovers() == []


@pytest.mark.parametrize("name", ["../x", "edge\n01", "x" * 300, "édge"])
def test_hostile_hostname_is_refused_with_exit_2(station: Station, name: str) -> None:
    _ready(station)
    # refused while the options are read, before any board or bundle is looked at
    r = station.alma("flash", "--yes", "--console", "none", "--hostname", name, device=None)
    assert r.returncode == 2 and "is not a host name" in r.stderr, r.stderr
    assert station.records_list() == [] and station.leftovers() == []


def test_hostnames_csv_must_name_every_board(station: Station, tmp_path: Path) -> None:
    _ready(station)
    csv = tmp_path / "boards.csv"
    csv.write_text("1-3,edge-a\n1-4,edge-b\n")
    r = station.alma("flash", "--yes", "--console", "none", "--all", "--hostnames", str(csv), device="three-boards")
    assert r.returncode == 2 and "no name for the board(s) at USB 1-8.4" in r.stderr
