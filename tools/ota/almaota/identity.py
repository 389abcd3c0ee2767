"""alma-identity: the board's identity kept on the data partition, so it survives a slot switch.

On a board /etc and /home belong to the rootfs slot, and an A/B update writes the image's
rootfs whole into the other slot: after the reboot the new slot would have the image's
hostname, new ssh host keys and no flash-time admin key, so the desktop (which pins the host
key) could not log in and hawkBit (device id = hostname) would see a stranger. The identity
lives in ``/data/alma-identity`` instead (docs/ota.md, "The board's identity"):

- ``hostname``: restored into ``/etc/hostname`` and the kernel at every boot (before
  systemd-hostnamed, sshd and SWUpdate read it);
- ``ssh_host_<type>_key``: sshd reads its host keys there (``00-alma-identity.conf``);
- ``authorized_keys.<user>``: the flash-time admin keys (sshd's second AuthorizedKeysFile).

The first boot after a flash (the flash hook's stamp ``/etc/alma/flashed`` differs from the
one saved) saves what the flashed slot holds: the hostname the hook wrote and its admin keys
(``/etc/alma/flash-authorized_keys.<user>``); the host keys are the slot's (or new ones)
when none are saved. A slot an update wrote has no stamp: /data wins. A piece missing later
is saved again from the running slot; a corrupt one is set aside (``*.bad``) first, never used.
Stdlib only; run by alma-identity.service.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from almaboard.errors import BoardError, run_main
from almaboard.files import write_atomic
from almaboard.text import is_hostname

PROG = "alma-identity"
STATE = "data/alma-identity"
KEY_TYPES = ("ed25519", "ecdsa", "rsa")  # the host key types OpenSSH's sshd loads by default
_FLASH_KEYS = re.compile(r"^flash-authorized_keys\.([a-z_][a-z0-9_-]{0,31})$")
_KEY_LINE = re.compile(r"^(ssh-|ecdsa-|sk-)[A-Za-z0-9@._+/= -]{1,8192}$")
KEYGEN_TIMEOUT_S = 300


def _read(path: Path, limit: int = 64 * 1024) -> str | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError:
        return None
    return None if len(data) > limit else data.decode("utf-8", "replace")


def _hostname(text: str | None) -> str | None:
    name = (text or "").strip()
    return name if is_hostname(name) else None


def _set_aside(path: Path, log: list[str], why: str) -> None:
    os.replace(path, path.with_name(path.name + ".bad"))
    log.append(f"{path.name}: {why}: set aside as {path.name}.bad")


def _valid_key(path: Path) -> bool:
    """A private key ssh-keygen can read (its public half derives from it)."""
    r = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(path)], capture_output=True, stdin=subprocess.DEVNULL, timeout=60, check=False
    )
    return r.returncode == 0


def _keep_hostname(root: Path, store: Path, log: list[str], flashed: bool) -> str:
    saved_path = store / "hostname"
    saved = _read(saved_path)
    name = None if flashed else _hostname(saved)
    if saved is not None and name is None and not flashed:
        _set_aside(saved_path, log, "not an RFC 1123 host name")
    if name is None:  # first boot, or the copy lost: the running slot's (as flashed) is all there is
        name = _hostname(_read(root / "etc/hostname"))
        if name is None:
            raise BoardError("no board name saved and /etc/hostname holds none: the board keeps the image's")
        write_atomic(saved_path, f"{name}\n".encode(), mode=0o644)
        log.append(f"hostname {name}: saved")
    etc = root / "etc/hostname"
    if _hostname(_read(etc)) != name:
        # in place: /etc/hostname is the one writable path of /etc for this unit
        with open(etc, "w") as fh:
            fh.write(f"{name}\n")
        log.append(f"hostname {name}: restored into /etc/hostname")
    return name


def _keep_host_keys(root: Path, store: Path, log: list[str]) -> None:
    have = []
    for t in KEY_TYPES:
        key = store / f"ssh_host_{t}_key"
        if key.exists() and not _valid_key(key):
            _set_aside(key, log, "not a readable private key")
            (store / f"ssh_host_{t}_key.pub").unlink(missing_ok=True)
        if key.exists():
            have.append(t)
    if have:
        return
    # First boot (or every copy lost): the slot's own keys, as the desktop may have pinned them.
    for t in KEY_TYPES:
        src = root / f"etc/ssh/ssh_host_{t}_key"
        if src.is_file() and not src.is_symlink() and _valid_key(src):
            write_atomic(store / src.name, src.read_bytes(), mode=0o600)
            pub = src.with_name(src.name + ".pub")
            if pub.is_file():
                write_atomic(store / pub.name, pub.read_bytes(), mode=0o644)
            have.append(t)
    if have:
        log.append(f"host keys saved from the slot: {', '.join(have)}")
        return
    key = store / "ssh_host_ed25519_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(key)],
        capture_output=True, stdin=subprocess.DEVNULL, timeout=KEYGEN_TIMEOUT_S, check=True,
    )  # fmt: skip
    log.append("host key made: ed25519")


def _flashed(root: Path, store: Path) -> str | None:
    """The flash hook's stamp when this is the first boot after a (re)flash, else None: the
    flashed slot's hostname and admin keys then win over what /data holds from before."""
    stamp = (_read(root / "etc/alma/flashed", 256) or "").strip()
    return stamp if stamp and stamp != (_read(store / "flashed", 256) or "").strip() else None


def _keep_admin_keys(root: Path, store: Path, log: list[str]) -> None:
    """The flash-time admin keys (/etc/alma/flash-authorized_keys.<user>, the flash hook's)."""
    for old in store.glob("authorized_keys.*"):
        old.unlink()
    alma = root / "etc/alma"
    for src in sorted(alma.glob("flash-authorized_keys.*")) if alma.is_dir() else []:
        m = _FLASH_KEYS.match(src.name)
        text = _read(src)
        if not m or text is None:
            continue
        lines = [ln for ln in text.splitlines() if _KEY_LINE.match(ln)]
        write_atomic(store / f"authorized_keys.{m.group(1)}", "".join(f"{ln}\n" for ln in lines).encode(), mode=0o644)
        log.append(f"admin keys of {m.group(1)} saved: {len(lines)}")


def _store(root: Path, log: list[str]) -> Path:
    """/data/alma-identity, a directory only root writes: sshd takes its host keys and admin
    keys from it. Whatever else stands there (a symlink, another user's directory, one others
    may write: nothing promises /data is root's alone) is set aside unread, never followed.
    This runs before sysinit.target, before any other user's process could swap it after the
    check."""
    store = root / STATE
    try:
        st = store.lstat()
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            # a name of its own: one set aside before (a directory) cannot be replaced, and a
            # failure here would leave sshd reading what stands there
            for aside in (f"{STATE}.bad", *(f"{STATE}.bad.{i}" for i in range(1, 1000))):
                if not os.path.lexists(root / aside):
                    break
            else:
                raise BoardError(f"{store} is not root's alone and nowhere to set it aside: remove {store}.bad*")
            os.rename(store, root / aside)
            log.append(f"{STATE}: not a directory only root writes: set aside as {aside}")
    store.mkdir(parents=True, exist_ok=True, mode=0o755)
    os.chmod(store, 0o755)  # made under UMask=0077; sshd's StrictModes: not writable by others
    return store


def keep(root: Path = Path("/"), *, set_kernel: bool = True) -> dict[str, Any]:
    """Save what is missing under ``root``/data/alma-identity, restore the hostname from it."""
    log: list[str] = []
    store = _store(root, log)
    stamp = _flashed(root, store)
    # the host keys first: sshd reads them only here, so a board with no name still answers ssh
    _keep_host_keys(root, store, log)
    name = _keep_hostname(root, store, log, stamp is not None)
    if set_kernel and socket.gethostname() != name:
        socket.sethostname(name)  # PID 1 set it from the slot's /etc/hostname before this ran
        log.append(f"hostname {name}: set")
    if stamp is not None:
        _keep_admin_keys(root, store, log)
        write_atomic(store / "flashed", f"{stamp}\n".encode(), mode=0o644)
    return {"hostname": name, "done": log}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--root", type=Path, default=Path("/"), help=argparse.SUPPRESS)  # tests
    a = p.parse_args(argv)

    def body() -> int:
        print(json.dumps(keep(a.root, set_kernel=a.root == Path("/"))), flush=True)
        return 0

    return run_main(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
