"""Privacy by construction: an empty immutable sensor set, no capture-device reference
anywhere in what the image ships, and a run-time refusal when one of our files is a capture
device."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest
from erangrid import privacy
from erangrid.errors import PrivacyViolation

REPO = Path(__file__).resolve().parents[2]
SHIPPED = [REPO / "tools/idlegrid", REPO / "layers/meta-alma/recipes-alma/eran-grid"]

# Device paths and stacks that capture the owner: camera, microphone, input events. Kept in
# this file only; this file is not shipped and is excluded from the scan below.
FORBIDDEN = re.compile(
    r"/dev/(video|snd|input|dsp|audio|mixer|media|hidraw|uinput|v4l)"
    r"|\bv4l2?\b|video4linux|\balsa\b|libasound|\bevdev\b|pyaudio|sounddevice|pulseaudio|pipewire"
    r"|\bcv2\b|libcamera|picamera|gstreamer",
    re.IGNORECASE,
)


def test_sensor_set_is_empty_and_immutable():
    assert len(privacy.SENSORS) == 0
    assert isinstance(privacy.SENSORS, frozenset)
    with pytest.raises(AttributeError):
        privacy.SENSORS.add("camera")  # type: ignore[attr-defined]
    privacy.assert_empty_sensor_set()


def test_a_sensor_smuggled_in_is_refused(monkeypatch):
    monkeypatch.setattr(privacy, "SENSORS", frozenset({"mic"}))
    with pytest.raises(PrivacyViolation, match="sensor set must be empty"):
        privacy.assert_empty_sensor_set()


def _shipped_files() -> list[Path]:
    files = []
    for base in SHIPPED:
        for path in base.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.resolve() != Path(__file__).resolve():
                files.append(path)
    return files


def test_nothing_shipped_references_a_capture_device():
    files = _shipped_files()
    assert any(f.name == "eran-grid.service" for f in files) and any(f.suffix == ".bb" for f in files)
    hits = []
    for path in files:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if FORBIDDEN.search(line):
                hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert hits == []


def test_the_scan_would_catch_a_reference(tmp_path):
    # The scan above must be able to fail: each of these lines trips it.
    for line in (
        "open('/dev/video0')",
        "path = '/dev/snd/pcmC0D0c'",
        "import cv2",
        "DeviceAllow=/dev/input/event3",
        'RDEPENDS += "alsa-lib"',
        "from evdev import InputDevice",
    ):
        assert FORBIDDEN.search(line), line


def test_unit_denies_devices():
    unit = (REPO / "tools/idlegrid/systemd/eran-grid.service").read_text()
    assert "PrivateDevices=yes" in unit
    assert "DevicePolicy=closed" in unit
    assert "DeviceAllow" not in unit


def _fake_fd_dir(tmp_path: Path, major: int, minor: int) -> Path:
    node = tmp_path / "node"
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(major, minor))
    fds = tmp_path / "fd"
    fds.mkdir()
    (fds / "0").symlink_to("/dev/null")
    (fds / "7").symlink_to(node)
    return fds


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
@pytest.mark.parametrize(("major", "minor"), [(81, 0), (116, 24), (13, 64), (14, 3), (10, 223)])
def test_refuses_when_an_open_file_is_a_capture_device(tmp_path, major, minor):
    fds = _fake_fd_dir(tmp_path, major, minor)
    with pytest.raises(PrivacyViolation, match="capture device"):
        privacy.assert_no_sensor_fds(fds, frozenset())


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
def test_dynamic_majors_come_from_proc_devices(tmp_path):
    devices = tmp_path / "devices"
    devices.write_text("Character devices:\n  1 mem\n 81 video4linux\n237 hidraw\n\nBlock devices:\n237 hidraw\n")
    assert privacy.dynamic_capture_majors(devices) == frozenset({237})
    fds = _fake_fd_dir(tmp_path, 237, 0)
    with pytest.raises(PrivacyViolation):
        privacy.assert_no_sensor_fds(fds, privacy.dynamic_capture_majors(devices))
    privacy.assert_no_sensor_fds(fds, frozenset())  # 237 alone is not a fixed capture major


def test_own_real_fds_are_clean():
    privacy.assert_no_sensor_fds()  # this test process holds no capture device
