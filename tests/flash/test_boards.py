"""`alma boards` against the real libudev (pyudev) under umockdev with recorded USB devices."""

from __future__ import annotations

import json

import pytest
from support_flash import Station

ORIN = {
    "7023": ("apx-7023-agx-orin", "Jetson AGX Orin"),
    "7223": ("apx-7223-agx-orin-32gb", "Jetson AGX Orin 32GB"),
    "7323": ("apx-7323-orin-nx-16gb", "Jetson Orin NX 16GB"),
    "7423": ("apx-7423-orin-nx-8gb", "Jetson Orin NX 8GB"),
    "7523": ("apx-7523-orin-nano-8gb", "Jetson Orin Nano 8GB"),
    "7623": ("apx-7623-orin-nano-4gb", "Jetson Orin Nano 4GB"),
}


def _json(station: Station, device: str, *args: str) -> tuple[int, dict[str, object]]:
    r = station.alma("boards", "--json", *args, device=device)
    assert r.stderr == "" or "waiting" in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)


@pytest.mark.parametrize("pid", sorted(ORIN))
def test_each_orin_pid_is_a_board_in_recovery_mode(station: Station, pid: str) -> None:
    device, module = ORIN[pid]
    code, out = _json(station, device)
    assert code == 0
    (board,) = out["boards"]  # type: ignore[misc]
    assert board["vendor"] == "0955" and board["product"] == pid
    assert board["state"] == "recovery"
    assert board["module"].startswith(module)
    assert board["soc"] == "T234"
    assert board["usb_instance"] == "1-3"  # busnum-devpath: what initrd-flash --usb-instance takes
    assert board["speed"] == "high-speed (USB 2.0)"
    assert board["via_hub"] is False
    assert board["devnode"] == "/dev/bus/usb/001/007"
    assert out["recovery"] == 1


def test_board_behind_a_hub_has_the_hub_port_in_its_instance(station: Station) -> None:
    code, out = _json(station, "apx-7523-behind-hub")
    assert code == 0
    (board,) = out["boards"]  # type: ignore[misc]
    assert board["usb_instance"] == "1-8.4"
    assert board["via_hub"] is True
    # the hub itself (05e3:0610) and the root hub are not boards
    plain = station.alma("boards", device="apx-7523-behind-hub")
    assert plain.stdout.startswith("1-8.4\trecovery\t0955:7523\tT234")
    assert "via-hub" in plain.stdout


def test_flashpkg_gadget_is_a_flash_in_progress(station: Station) -> None:
    code, out = _json(station, "flashpkg-gadget")
    (board,) = out["boards"]  # type: ignore[misc]
    assert (board["vendor"], board["product"]) == ("1d6b", "0104")
    assert board["state"] == "flashing"
    assert board["exports"] == ["flashpkg"]
    assert "initrd-flash gadget" in board["description"]
    assert out["recovery"] == 0


def test_booted_board_is_shown_and_a_mouse_is_not(station: Station) -> None:
    r = station.alma("boards", device="booted-board-and-mouse")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("1-5\tbooted\t1d6b:0104")
    assert "046d" not in r.stdout
    # no board in recovery mode: say what to do, and that an empty listing proves nothing
    assert "not proof" in r.stderr and "recovery mode" in r.stderr


def test_no_board_says_what_to_do_not_just_not_found(station: Station) -> None:
    r = station.alma("boards", device="no-nvidia")
    assert r.returncode == 0
    assert r.stdout == ""
    for must in ("not proof", "FC_REC", "Force Recovery", "not a hub", "charge-only", "alma boards --wait"):
        assert must in r.stderr


def test_three_boards_are_sorted_by_instance(station: Station) -> None:
    code, out = _json(station, "three-boards")
    assert [b["usb_instance"] for b in out["boards"]] == ["1-3", "1-4", "1-8.4"]  # type: ignore[union-attr,index]
    assert out["recovery"] == 3


def test_timeout_without_wait_is_a_usage_error(station: Station) -> None:
    r = station.alma("boards", "--timeout", "1", device="no-nvidia")
    assert r.returncode == 2
    assert "--timeout only makes sense with --wait" in r.stderr


def test_wait_returns_at_once_when_a_board_is_there(station: Station) -> None:
    code, out = _json(station, "apx-7523-orin-nano-8gb", "--wait", "--timeout", "5")
    assert code == 0 and out["timed_out"] is False and out["recovery"] == 1


def test_wait_timeout_has_its_own_exit_code(station: Station) -> None:
    r = station.alma("boards", "--wait", "--timeout", "0.3", device="no-nvidia")
    assert r.returncode == 124
    assert "not proof" in r.stderr
    r = station.alma("boards", "--wait", "--timeout", "0.3", "--json", device="no-nvidia")
    assert r.returncode == 124 and json.loads(r.stdout)["timed_out"] is True


def test_help_documents_exit_codes(station: Station) -> None:
    r = station.alma("boards", "--help", device=None)
    assert "Exit codes" in r.stdout and "124" in r.stdout
