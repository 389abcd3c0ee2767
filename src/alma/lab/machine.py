"""The fake machine under a virtual board: what the shipped code reads at the board's paths.

- Thermal zones (``/sys/class/thermal`` in the container is a bind of ``thermal/`` here): the
  Orin R36 zone set with its trip points; a test changes a zone's temperature, type or
  presence by writing these host files, and the board's programs see it at their next read.
- The boot slots (``/var/lib/alma-lab/uefi.json`` in the container is ``slot/uefi.json``
  here), kept outside the board's disk so a reboot into the other slot is real: the
  supervisor picks the slot at every power-on the way UEFI does (:func:`power_on`), and the
  board's ``nvbootctrl`` (:data:`NVBOOTCTRL`, a stand-in for L4T's tool with the commands
  alma-ota uses) reads and writes the same state.
- The rootfs slots (``/dev/disk/by-partlabel/APP`` and ``APP_b`` in the container are binds
  of ``disk/APP`` and ``disk/APP_b`` here): the files SWUpdate writes. What a slot "is"
  follows tests/support_update.py's simulated board: an image's first line is
  ``{"alma-sim": {"version", "health", "boots"}}``; at power-on the supervisor reads the
  chosen slot's header (:func:`boot_plan`): ``boots: false`` hangs that boot (a retry spent,
  the watchdog resets it), ``health: critical`` boots an image whose health finds a fabric
  link missing, the version is what the board reports (``/etc/alma-release``).
- The slot's identity (``identity/`` here, :func:`switch_identity`): on a board /etc is part
  of the rootfs slot, so the identity files the flash hook and the first boot write (the
  hostname, the ssh host key, the admin's authorized_keys) belong to the slot. The supervisor
  keeps each slot's copy and puts the booted slot's on the board's disk at power-on; a slot
  written since its last boot gets the image's files as installed (the image's hostname, no
  flash-time admin key) and a new host key (the image's first-boot key generation).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alma.errors import UserError

# Orin (R36): every zone has a 70 C passive trip (hot-surface alert), 99 C passive (throttle)
# and 104.5 C critical (kernel shutdown).
ZONES = (
    "cpu-thermal",
    "gpu-thermal",
    "cv0-thermal",
    "cv1-thermal",
    "cv2-thermal",
    "soc0-thermal",
    "soc1-thermal",
    "soc2-thermal",
    "tj-thermal",
)
TRIPS = (("passive", 70000), ("passive", 99000), ("critical", 104500))
IDLE_C = 45.0
RETRIES = 3


def make_thermal(top: Path, celsius: float = IDLE_C) -> None:
    top.mkdir(parents=True, exist_ok=True)
    for n, name in enumerate(ZONES):
        z = top / f"thermal_zone{n}"
        z.mkdir(exist_ok=True)
        (z / "type").write_text(name + "\n")
        (z / "temp").write_text(f"{round(celsius * 1000)}\n")
        for k, (kind, milli) in enumerate(TRIPS):
            (z / f"trip_point_{k}_type").write_text(kind + "\n")
            (z / f"trip_point_{k}_temp").write_text(f"{milli}\n")
    for p in top.rglob("*"):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    os.chmod(top, 0o755)


def find_zone(top: Path, zone: str) -> Path:
    """A zone by its directory (``thermal_zone8``), its type (``tj-thermal``) or short type (``tj``)."""
    want = {zone, f"{zone}-thermal"}
    for z in sorted(top.glob("thermal_zone*")):
        kind = (z / "type").read_text().strip() if (z / "type").exists() else ""
        if z.name == zone or kind in want:
            return z
    known = ", ".join(
        sorted((z / "type").read_text().strip() for z in top.glob("thermal_zone*/") if (z / "type").exists())
    )
    raise UserError(f"no thermal zone {zone!r} on this board", hint=f"zones: {known}")


def set_temp(top: Path, zone: str, celsius: float) -> Path:
    """Written in place, as sysfs changes: readers keep the file open and pread it again."""
    z = find_zone(top, zone)
    with open(z / "temp", "r+") as fh:
        fh.write(f"{round(celsius * 1000)}\n")
        fh.truncate()
    return z


# ---- boot slots ----------------------------------------------------------------------------


def new_slots(top: Path) -> None:
    top.mkdir(parents=True, exist_ok=True)
    state = {
        "rootfs": {
            "current": 0,
            "active": 0,
            "slots": [{"retry_count": RETRIES, "status": "normal"} for _ in range(2)],
            "successful": [True, False],
        },
        "bootloader": {"current": 0, "active": 0, "version": "36.4.3", "capsule_status": 0},
        "boots": 0,
    }
    _save(top, state)


def _save(top: Path, state: dict[str, Any]) -> None:
    tmp = top / ".uefi.json.new"
    tmp.write_text(json.dumps(state, indent=1))
    os.chmod(tmp, 0o644)
    tmp.replace(top / "uefi.json")


def slots(top: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((top / "uefi.json").read_text())
    return data


# ---- rootfs slots ---------------------------------------------------------------------------

SLOT_LABELS = ("APP", "APP_b")  # GPT labels of rootfs A and B (meta-tegra's *_rootfs_ab.xml)
SLOT_BYTES = 64 << 20  # sparse: room for a test image, nothing allocated until written
FACTORY_VERSION = "1.0.0"
HEADER_KEY = "alma-sim"  # the simulated board's convention (tests/support_update.rootfs_image)
MAX_HEADER = 4096
# The header is the slot's content (whatever a .swu wrote): its version reaches
# /etc/alma-release only when it is a plain version string.
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+~_-]{0,63}")  # fullmatch: "$" lets a "\n" through
# A "critical" image: its kernel lacks the fabric NIC's driver, so the link its health
# configuration expects is absent (alma-health's links check: CRITICAL "... absent").
SICK_LINK = "almasick0"


def image_header(version: str, *, health: str = "ok", boots: bool = True) -> bytes:
    """The first line of a rootfs image as the lab reads it."""
    return (json.dumps({HEADER_KEY: {"version": version, "health": health, "boots": boots}}) + "\n").encode()


def new_disk(top: Path, version: str = FACTORY_VERSION) -> None:
    """Both rootfs slots: A holds the factory image (``version``), B is blank (never booted)."""
    top.mkdir(parents=True, exist_ok=True)
    for label in SLOT_LABELS:
        with open(top / label, "wb") as fh:
            fh.truncate(SLOT_BYTES)
    with open(top / SLOT_LABELS[0], "r+b") as fh:
        fh.write(image_header(version))


def read_header(top: Path, slot: int) -> dict[str, object] | None:
    """The slot's image header, or None for a blank, torn or foreign image (it does not boot)."""
    try:
        with open(top / SLOT_LABELS[slot], "rb") as fh:
            first = fh.read(MAX_HEADER).split(b"\n", 1)[0]
        got = json.loads(first)[HEADER_KEY]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return got if isinstance(got, dict) else None


@dataclass(frozen=True)
class BootPlan:
    """What one power-on brings up: the slot, whether it boots, and what it is."""

    slot: int
    boots: bool
    version: str
    critical: bool


def boot_plan(slot_top: Path, disk_top: Path) -> BootPlan:
    """One power-on: UEFI picks the slot (:func:`power_on`), then the slot's image decides."""
    slot = power_on(slot_top)
    head = read_header(disk_top, slot)
    if head is None or not _VERSION.fullmatch(str(head.get("version", ""))):
        return BootPlan(slot, False, "", False)  # a blank, torn or foreign image does not boot
    boots, critical = head.get("boots") is not False, head.get("health") == "critical"
    return BootPlan(slot, boots, str(head.get("version", "")), critical)


def write_boot_files(out: Path, plan: BootPlan, health_toml: str) -> None:
    """The booted image's files that differ between images: ``alma-release`` (the version
    alma-ota reports) and, for a critical image, its ``health.toml`` (one fabric link more)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "alma-release").write_text(f'ID=alma\nVERSION_ID="{plan.version}"\n')
    if plan.critical:
        (out / "health.toml").write_text(sick_health(health_toml))


def sick_health(text: str) -> str:
    """``text`` (the image's health.toml) expecting one fabric link more, one that is absent."""
    data = tomllib.loads(text)
    data.setdefault("links", {}).setdefault("expected", {})[SICK_LINK] = 1000
    head = "[links.expected]\n"
    line = f"{SICK_LINK} = 1000\n"
    out = text.replace(head, head + line, 1) if head in text else text + f"\n{head}{line}"
    if tomllib.loads(out) != data:  # the image's file changed shape: say so, never boot a guess
        raise ValueError("health.toml: cannot add the sick image's link")
    return out


# ---- the slot's identity (its /etc) ---------------------------------------------------------

# What the flash hook and the image's first boot write into the slot's rootfs, relative to
# the root. The image installs the hostname (OE's base-files: the MACHINE) and the admin's
# authorized_keys (alma-access: the build's ALMA_ADMIN_KEYS); the host key is made at the
# first boot of a freshly written slot.
HOST_KEY = "etc/ssh/ssh_host_ed25519_key"
IDENTITY_FILES = ("etc/hostname", HOST_KEY, HOST_KEY + ".pub", "home/alma/.ssh/authorized_keys")
IMAGE = "image"  # identity/image: the files as the image installs them (before the flash hook)


def _in_root(root: Path, rel: str) -> Path | None:
    """``root/rel``, or None when a directory on the way there is a symlink. The board writes
    its own root (its admin owns /home/alma): an absolute link there, followed by this host-side
    root process, would copy, unlink or write the host's own files."""
    path = root
    for part in Path(rel).parent.parts:
        path = path / part
        if path.is_symlink():
            return None
    return root / rel


def save_identity(root: Path, dest: Path) -> None:
    """Copy the identity files of the board's root into ``dest`` (mode and owner kept)."""
    new = dest.with_name(dest.name + ".new")
    shutil.rmtree(new, ignore_errors=True)
    for rel in IDENTITY_FILES:
        src = _in_root(root, rel)
        if src is not None and src.is_file() and not src.is_symlink():
            (new / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, new / rel)
            st = src.stat()
            os.chown(new / rel, st.st_uid, st.st_gid)
    new.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(dest, ignore_errors=True)
    new.replace(dest)


def _restore_identity(src: Path, root: Path) -> None:
    for rel in IDENTITY_FILES:
        target = _in_root(root, rel)
        if target is None or not target.parent.is_dir():
            continue  # a link, or a directory the board removed: left as the board made it
        target.unlink(missing_ok=True)
        if (src / rel).is_file():
            shutil.copy2(src / rel, target)
            st = (src / rel).stat()
            os.chown(target, st.st_uid, st.st_gid)


def slot_stamp(disk_top: Path, slot: int) -> str:
    """What changes when SWUpdate (re)writes the slot file: its size, mtime and first bytes."""
    path = disk_top / SLOT_LABELS[slot]
    st = path.stat()
    with open(path, "rb") as fh:
        head = hashlib.sha256(fh.read(MAX_HEADER)).hexdigest()
    return f"{st.st_size}:{st.st_mtime_ns}:{head}"


def flashed_identity(top: Path, root: Path, disk_top: Path, slot: int = 0) -> None:
    """After the flash: the running slot ``slot`` holds ``root``'s identity, as flashed."""
    top.mkdir(parents=True, exist_ok=True)
    save_identity(root, top / SLOT_LABELS[slot])
    state = {"booted": slot, "stamps": {str(slot): slot_stamp(disk_top, slot)}}
    (top / "state.json").write_text(json.dumps(state) + "\n")


def switch_identity(top: Path, root: Path, disk_top: Path, slot: int) -> str:
    """At power-on, before the container starts: the board's root gets the identity of
    ``slot``. The slot booted last keeps what its /etc holds now; a slot written since its
    last boot gets the image's files and a new host key. Returns what was done (logged)."""
    state = json.loads((top / "state.json").read_text())
    booted, stamps = state["booted"], state["stamps"]
    save_identity(root, top / SLOT_LABELS[booted])
    stamp = slot_stamp(disk_top, slot)
    if stamps.get(str(slot)) != stamp:  # a new image in this slot: its /etc as installed
        _restore_identity(top / IMAGE, root)
        key = _in_root(root, HOST_KEY)
        if key is None:
            done = f"rewritten: the image's identity, no host key ({Path(HOST_KEY).parent} is a link)"
        else:
            key.parent.mkdir(parents=True, exist_ok=True)
            for old in (key, key.with_name(key.name + ".pub")):
                old.unlink(missing_ok=True)
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "first-boot", "-f", str(key)],
                check=True, stdin=subprocess.DEVNULL, capture_output=True,
            )  # fmt: skip
            done = "rewritten: the image's identity, a new host key"
    elif booted != slot:
        _restore_identity(top / SLOT_LABELS[slot], root)
        done = "its own identity"
    else:
        done = "unchanged"
    state.update(booted=slot, stamps={**stamps, str(slot): stamp})
    tmp = top / "state.json.new"
    tmp.write_text(json.dumps(state) + "\n")
    tmp.replace(top / "state.json")
    return f"slot {'ab'[slot]}: {done}"


def power_on(top: Path) -> int:
    """Pick the rootfs slot for this boot as UEFI does: the active slot unless it is
    unbootable or out of retries (an uncommitted slot costs one retry per boot); returns it."""
    st = slots(top)
    rf = st["rootfs"]
    target = rf["active"]
    for _ in range(4):
        slot = rf["slots"][target]
        if slot["status"] == "unbootable" or (not rf["successful"][target] and slot["retry_count"] == 0):
            slot["status"] = "unbootable"
            target = 1 - target
            rf["active"] = target
            continue
        if not rf["successful"][target]:
            slot["retry_count"] -= 1
        break
    rf["current"] = target
    st["boots"] += 1
    _save(top, st)
    return int(target)


# A container restart keeps the kernel's boot id; nspawn gives the container a new one at
# every start, but units with ProtectProc= mount their own /proc and read the kernel's. So
# guard (a unit) and health (over ssh) would disagree, and a reboot would not change what the
# guard sees. The board copies nspawn's id early in every boot and binds it over the /proc of
# those units: one id per boot for every program, new at every reboot, as on a board.
BOOT_ID_UNIT = """[Unit]
Description=alma lab: this boot's id for units with their own /proc
DefaultDependencies=no
Before=sysinit.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/cp /proc/sys/kernel/random/boot_id /run/alma-lab-boot-id

[Install]
WantedBy=sysinit.target
"""
BOOT_ID_DROPIN = """# alma lab: the board's one boot id (alma-lab-boot-id.service), over this unit's own /proc
[Unit]
Requires=alma-lab-boot-id.service
After=alma-lab-boot-id.service

[Service]
BindReadOnlyPaths=/run/alma-lab-boot-id:/proc/sys/kernel/random/boot_id
"""


# The board's nvbootctrl: stdlib only, run by the board's python3 (same output as L4T R36's
# tool for what alma-ota reads: get-current-slot, dump-slots-info, set-active-boot-slot,
# mark-boot-successful, set-slot-as-unbootable, bootloader verify). The real one is a small
# native program that alma-ota starts a dozen times per update, so the stand-in costs little
# more than the interpreter's start: isolated and without site (-IS: no site-packages scan,
# no .pth files, no PYTHON* variables), and without the json module, whose import (re, enum)
# was half of each call (measured: 16.5 ms of CPU per call before, 9 after; a bare start is 6).
# It reads and writes uefi.json (what the supervisor writes with json: objects, lists,
# integers, booleans, plain strings) with the few lines below; anything else is refused.
NVBOOTCTRL = r'''#!/usr/bin/python3 -IS
"""nvbootctrl of an alma lab virtual board (state: /var/lib/alma-lab/uefi.json, on the host)."""
import os, sys
STATE = "/var/lib/alma-lab/uefi.json"
RETRIES = 3
WORDS = {"true": True, "false": False, "null": None}
def load(text):
    """uefi.json as the lab writes it: objects, lists, integers, booleans, plain strings."""
    pos = 0
    def skip():
        nonlocal pos
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
    def value():
        nonlocal pos
        skip()
        c = text[pos:pos + 1]
        if c in ("{", "["):
            pos += 1
            out = {} if c == "{" else []
            close = "}" if c == "{" else "]"
            skip()
            while text[pos:pos + 1] != close:
                if c == "{":
                    key = value()
                    skip()
                    if not isinstance(key, str) or text[pos:pos + 1] != ":":
                        raise ValueError(f"bad object at byte {pos}")
                    pos += 1
                    out[key] = value()
                else:
                    out.append(value())
                skip()
                if text[pos:pos + 1] == ",":
                    pos += 1
                    skip()
                elif text[pos:pos + 1] != close:
                    raise ValueError(f"expected , or {close} at byte {pos}")
            pos += 1
            return out
        if c == '"':
            end = text.find('"', pos + 1)
            got = text[pos + 1:end] if end > 0 else "\\"
            if "\\" in got or any(ord(ch) < 32 for ch in got):
                raise ValueError(f"unsupported string at byte {pos}")
            pos = end + 1
            return got
        start = pos
        while pos < len(text) and (text[pos].isalnum() or text[pos] == "-"):
            pos += 1
        word = text[start:pos]
        if word in WORDS:
            return WORDS[word]
        if word.lstrip("-").isdigit() and word.isascii():
            return int(word)
        raise ValueError(f"unsupported value {word[:20]!r} at byte {start}")
    got = value()
    skip()
    if pos != len(text):
        raise ValueError(f"trailing data at byte {pos}")
    return got
def dump(v):
    if isinstance(v, bool) or v is None:
        return {True: "true", False: "false", None: "null"}[v]
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        if '"' in v or "\\" in v or any(ord(ch) < 32 for ch in v):
            raise ValueError(f"unsupported string {v[:20]!r}")
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(dump(x) for x in v) + "]"
    return "{" + ", ".join(f"{dump(k)}: {dump(x)}" for k, x in v.items()) + "}"
def main(argv):
    target = "bootloader"
    if argv[:1] == ["-t"]:
        target, argv = argv[1], argv[2:]
    with open(STATE) as fh:
        st = load(fh.read())
    rf, bl = st["rootfs"], st["bootloader"]
    cmd = argv[0] if argv else ""
    letter = "AB"
    if target == "rootfs" and cmd == "get-current-slot":
        print(rf["current"])
    elif target == "rootfs" and cmd == "get-number-slots":
        print(2)
    elif target == "rootfs" and cmd == "dump-slots-info":
        print(f"Current rootfs slot: {letter[rf['current']]}")
        print(f"Active rootfs slot: {letter[rf['active']]}")
        print("num_slots: 2")
        for i, s in enumerate(rf["slots"]):
            print(f"slot: {i},             retry_count: {s['retry_count']},             status: {s['status']}")
    elif target == "rootfs" and cmd == "set-active-boot-slot":
        n = int(argv[1])
        rf["active"] = n
        rf["slots"][n].update(retry_count=RETRIES, status="normal")
        if n != rf["current"]:
            rf["successful"][n] = False
    elif target == "rootfs" and cmd == "mark-boot-successful":
        rf["successful"][rf["current"]] = True
        rf["slots"][rf["current"]].update(retry_count=RETRIES, status="normal")
    elif target == "rootfs" and cmd == "set-slot-as-unbootable":
        rf["slots"][int(argv[1])]["status"] = "unbootable"
    elif target == "bootloader" and cmd == "dump-slots-info":
        print(f"Current version: {bl['version']}")
        print(f"Capsule update status: {bl['capsule_status']}")
        print(f"Current bootloader slot: {letter[bl['current']]}")
        print(f"Active bootloader slot: {letter[bl['active']]}")
        print("num_slots: 2")
        for i in range(2):
            print(f"slot: {i},             status: normal")
    elif target == "bootloader" and cmd == "verify":
        bl["capsule_status"] = 0
    elif target == "bootloader" and cmd == "get-current-slot":
        print(bl["current"])
    else:
        print(f"nvbootctrl: unknown command {cmd}", file=sys.stderr)
        return 1
    tmp = STATE + ".new"
    with open(tmp, "w") as fh:
        fh.write(dump(st) + "\n")
    os.replace(tmp, STATE)
    return 0
sys.exit(main(sys.argv[1:]))
'''


def install_nvbootctrl(upper: Path) -> None:
    dest = upper / "usr/bin/nvbootctrl"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(NVBOOTCTRL)
    os.chmod(dest, 0o755)


def remove(top: Path) -> None:
    shutil.rmtree(top, ignore_errors=True)
