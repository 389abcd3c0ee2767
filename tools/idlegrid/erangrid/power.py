"""On AC or on battery, by systemd's rule (``systemd-ac-power``): any online non-battery
supply means AC; else a discharging battery means battery; else (nothing known) AC."""

from __future__ import annotations

import os
from pathlib import Path


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def on_ac(power_supply: Path = Path("/sys/class/power_supply")) -> bool:
    base = str(power_supply)
    try:
        supplies = sorted(os.listdir(base))
    except OSError:
        return True  # no power-supply class at all: a mains-only board
    discharging = False
    for name in supplies:
        dev = f"{base}/{name}"
        # Peripheral supplies (a wireless mouse's battery) say scope=Device: not the machine's.
        if _read(f"{dev}/scope") == "Device":
            continue
        kind = _read(f"{dev}/type")
        if kind is None:
            continue
        if kind != "Battery":
            if _read(f"{dev}/online") == "1":
                return True
        elif _read(f"{dev}/status") == "Discharging":
            discharging = True
    return not discharging
