"""On AC or on battery, by systemd's rule (``systemd-ac-power``): any online non-battery
supply means AC; else a discharging battery means battery; else (nothing known) AC."""

from __future__ import annotations

from pathlib import Path


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def on_ac(power_supply: Path = Path("/sys/class/power_supply")) -> bool:
    try:
        supplies = sorted(power_supply.iterdir())
    except OSError:
        return True  # no power-supply class at all: a mains-only board
    discharging = False
    for dev in supplies:
        # Peripheral batteries (a wireless mouse's) say scope=Device: not the machine's power.
        if _read(dev / "scope") == "Device":
            continue
        kind = _read(dev / "type")
        if kind is None:
            continue
        if kind != "Battery":
            if _read(dev / "online") == "1":
                return True
        elif _read(dev / "status") == "Discharging":
            discharging = True
    return not discharging
