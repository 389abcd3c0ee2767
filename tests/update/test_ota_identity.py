"""alma-identity: the board's identity kept on /data across slot switches (docs/ota.md, "The
board's identity"). Run as the board runs it (its own program, the real ssh-keygen) on a
board root in tmp_path: the first boot after the flash saves the flashed identity; a slot an
update wrote (the image's hostname, new host keys, no flash key) gets it back; a missing or
corrupt copy on /data is saved again from the running slot, the corrupt one set aside."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import require_tool

REPO = Path(__file__).resolve().parents[2]
FLASH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEJkX8cO1pKuXb8ZZdUFW2nRvHZ1rGq0r0O0v5YpX1aB flash"
IMAGE_HOSTNAME = "jetson-agx-orin-devkit"


@pytest.fixture(autouse=True)
def _keygen() -> None:
    require_tool("ssh-keygen")


def identity(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'tools/ota'}:{REPO / 'tools/board'}"}
    return subprocess.run(
        [sys.executable, "-m", "almaota.identity", "--root", str(root)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


def keep(root: Path) -> dict[str, object]:
    r = identity(root)
    assert r.returncode == 0, r.stderr
    got: dict[str, object] = json.loads(r.stdout)
    return got


def host_key(root: Path) -> Path:
    key = root / "etc/ssh/ssh_host_ed25519_key"
    key.parent.mkdir(parents=True, exist_ok=True)
    for old in (key, key.with_name(key.name + ".pub")):
        old.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=120)
    return key


def flashed(root: Path, name: str = "edge-7", stamp: str = "flash-1") -> Path:
    """A rootfs slot as the flash hook leaves it, at its first boot (host key made)."""
    (root / "etc/alma").mkdir(parents=True, exist_ok=True)
    (root / "etc/hostname").write_text(f"{name}\n")
    (root / "etc/alma/flashed").write_text(f"{stamp}\n")
    (root / "etc/alma/flash-authorized_keys.alma").write_text(FLASH_KEY + "\n")
    host_key(root)
    (root / "data").mkdir(exist_ok=True)
    return root / "data/alma-identity"


def updated(root: Path) -> None:
    """The same root after an update wrote the other slot: the image's /etc, a new host key."""
    (root / "etc/hostname").write_text(IMAGE_HOSTNAME + "\n")
    (root / "etc/alma/flashed").unlink()
    (root / "etc/alma/flash-authorized_keys.alma").unlink()
    host_key(root)


def test_first_boot_saves_the_flashed_identity(tmp_path: Path) -> None:
    store = flashed(tmp_path)
    keep(tmp_path)
    assert (store / "hostname").read_text() == "edge-7\n"
    assert (store / "ssh_host_ed25519_key").read_bytes() == (tmp_path / "etc/ssh/ssh_host_ed25519_key").read_bytes()
    assert (store / "ssh_host_ed25519_key").stat().st_mode & 0o777 == 0o600
    assert (store / "authorized_keys.alma").read_text() == FLASH_KEY + "\n"
    assert (store / "authorized_keys.alma").stat().st_mode & 0o777 == 0o644  # sshd's StrictModes
    assert (tmp_path / "etc/hostname").read_text() == "edge-7\n"


def test_a_slot_an_update_wrote_gets_the_board_identity_back(tmp_path: Path) -> None:
    store = flashed(tmp_path)
    keep(tmp_path)
    key = (store / "ssh_host_ed25519_key").read_bytes()
    updated(tmp_path)
    got = keep(tmp_path)
    assert got["hostname"] == "edge-7"
    assert (tmp_path / "etc/hostname").read_text() == "edge-7\n"  # the image's name replaced
    assert (store / "ssh_host_ed25519_key").read_bytes() == key  # the pinned key, not the slot's new one
    assert (store / "authorized_keys.alma").read_text() == FLASH_KEY + "\n"
    keep(tmp_path)  # and at every boot after it, nothing changes
    assert (store / "hostname").read_text() == "edge-7\n" and (store / "ssh_host_ed25519_key").read_bytes() == key


def test_a_missing_copy_is_saved_again_from_the_running_slot(tmp_path: Path) -> None:
    store = flashed(tmp_path)
    keep(tmp_path)
    (store / "hostname").unlink()
    (store / "ssh_host_ed25519_key").unlink()
    keep(tmp_path)
    assert (store / "hostname").read_text() == "edge-7\n"
    assert (store / "ssh_host_ed25519_key").read_bytes() == (tmp_path / "etc/ssh/ssh_host_ed25519_key").read_bytes()


def test_a_corrupt_copy_is_set_aside_never_used(tmp_path: Path) -> None:
    store = flashed(tmp_path)
    keep(tmp_path)
    (store / "hostname").write_text("not a name; rm -rf /\n")
    (store / "ssh_host_ed25519_key").write_bytes(b"\0garbage")
    got = keep(tmp_path)
    assert got["hostname"] == "edge-7" and (tmp_path / "etc/hostname").read_text() == "edge-7\n"
    assert (store / "hostname.bad").read_text() == "not a name; rm -rf /\n"
    assert (store / "ssh_host_ed25519_key.bad").read_bytes() == b"\0garbage"
    assert (store / "ssh_host_ed25519_key").read_bytes() == (tmp_path / "etc/ssh/ssh_host_ed25519_key").read_bytes()
    assert any("set aside" in line for line in got["done"])  # type: ignore[attr-defined]


def test_a_first_boot_without_host_keys_makes_one_on_data(tmp_path: Path) -> None:
    store = flashed(tmp_path)
    for k in (tmp_path / "etc/ssh").iterdir():
        k.unlink()
    keep(tmp_path)
    r = subprocess.run(["ssh-keygen", "-y", "-f", str(store / "ssh_host_ed25519_key")], capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith(b"ssh-ed25519 ")


def test_a_reflash_wins_over_what_data_holds(tmp_path: Path) -> None:
    store = flashed(tmp_path)
    keep(tmp_path)
    flashed(tmp_path, name="edge-8", stamp="flash-2")
    (tmp_path / "etc/alma/flash-authorized_keys.alma").unlink()  # flashed without an extra key
    keep(tmp_path)
    assert (store / "hostname").read_text() == "edge-8\n"
    assert not (store / "authorized_keys.alma").exists()


def test_no_name_anywhere_is_refused(tmp_path: Path) -> None:
    flashed(tmp_path)
    (tmp_path / "etc/hostname").write_text("-bad-\n")
    r = identity(tmp_path)
    assert r.returncode != 0 and "holds none" in r.stderr, r.stderr
    assert not (tmp_path / "data/alma-identity/hostname").exists()
    # sshd takes its host keys from /data alone: a board without a name still answers ssh
    key = tmp_path / "data/alma-identity/ssh_host_ed25519_key"
    assert key.read_bytes() == (tmp_path / "etc/ssh/ssh_host_ed25519_key").read_bytes()


@pytest.mark.parametrize("how", ["symlink", "writable by others", "another user's"])
def test_a_store_not_root_s_alone_is_set_aside_unread(tmp_path: Path, how: str) -> None:
    """/data is not root's alone: what stands at /data/alma-identity and was not made by root
    alone (another's host key, admin keys, hawkBit name) is never used nor followed."""
    if how == "another user's" and os.geteuid() != 0:
        pytest.skip("needs root to hand a directory to another user")
    store = flashed(tmp_path)
    keep(tmp_path)
    updated(tmp_path)
    planted = tmp_path / "data/planted"
    store.rename(planted)
    (planted / "hostname").write_text("edge-9\n")
    if how == "symlink":
        store.symlink_to(planted)
    else:
        planted.rename(store)
        planted = store
        if how == "writable by others":
            os.chmod(store, 0o777)
        else:
            os.chown(store, 65534, 65534)
    mode = planted.stat().st_mode
    got = keep(tmp_path)
    assert got["hostname"] == IMAGE_HOSTNAME  # the slot's name: the planted one is not the board's
    assert (tmp_path / "etc/hostname").read_text() == IMAGE_HOSTNAME + "\n"
    assert not store.is_symlink() and store.stat().st_uid == os.geteuid() and store.stat().st_mode & 0o777 == 0o755
    assert (store / "hostname").read_text() == IMAGE_HOSTNAME + "\n"
    bad = tmp_path / "data/alma-identity.bad"
    assert bad.is_symlink() if how == "symlink" else (bad / "hostname").read_text() == "edge-9\n"
    if how == "symlink":
        assert planted.stat().st_mode == mode  # its target not touched either


def test_a_store_set_aside_twice_keeps_both(tmp_path: Path) -> None:
    """A store set aside before stays; the next one gets a name of its own, and the board's
    own store is made, never left to whatever stood there."""
    store = flashed(tmp_path)
    (tmp_path / "data/alma-identity.bad").mkdir()
    (tmp_path / "data/alma-identity.bad/hostname").write_text("edge-8\n")
    planted = tmp_path / "data/planted"
    planted.mkdir()
    (planted / "hostname").write_text("edge-9\n")
    store.symlink_to(planted)
    got = keep(tmp_path)
    assert got["hostname"] == "edge-7" and not store.is_symlink() and store.is_dir()
    assert (tmp_path / "data/alma-identity.bad.1").is_symlink()
    assert (tmp_path / "data/alma-identity.bad/hostname").read_text() == "edge-8\n"


# -- sshd with the image's drop-in, when /data holds no identity -------------------------------


def _sshd_with_the_dropin(root: Path) -> tuple[Path, int]:
    """sshd_config of the image's drop-in (00-alma-identity.conf) with / moved to ``root``."""
    from support_fleet import free_port

    dropin = (REPO / "tools/ota/ssh/00-alma-identity.conf").read_text()
    dropin = dropin.replace(" /data/", f" {root}/data/").replace(" /etc/", f" {root}/etc/")
    port = free_port()
    cfg = root / "sshd_config"
    cfg.write_text(f"ListenAddress 127.0.0.1\nPort {port}\nPidFile {root}/sshd.pid\nUsePAM no\n{dropin}")
    return cfg, port


def _offered_key(cfg: Path, port: int) -> str:
    """The ed25519 host key a real sshd with ``cfg`` offers (ssh-keyscan)."""
    sshd, keyscan = require_tool("/usr/sbin/sshd"), require_tool("ssh-keyscan")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(cfg)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            r = subprocess.run([keyscan, "-t", "ed25519", "-p", str(port), "127.0.0.1"],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
            if r.stdout.strip():
                return r.stdout.split()[2]
            time.sleep(0.2)
        raise AssertionError(f"sshd never answered (exit {proc.poll()})")
    finally:
        proc.kill()
        proc.communicate(timeout=60)


def test_sshd_answers_with_the_slots_own_key_when_data_holds_none(tmp_path: Path) -> None:
    # /data failed to mount (or was wiped before alma-identity ran): sshd must not exit
    # "no hostkeys available", or the board is out of reach until someone opens its console
    slot_key = host_key(tmp_path)
    cfg, port = _sshd_with_the_dropin(tmp_path)
    sshd = require_tool("/usr/sbin/sshd")
    r = subprocess.run([sshd, "-t", "-f", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert _offered_key(cfg, port) == slot_key.with_name(slot_key.name + ".pub").read_text().split()[1]


def test_sshd_offers_the_pinned_key_on_data_before_the_slots_own(tmp_path: Path) -> None:
    store = flashed(tmp_path)
    keep(tmp_path)
    updated(tmp_path)  # the new slot made a key of its own at its first boot
    pinned = (store / "ssh_host_ed25519_key.pub").read_text().split()[1]
    assert pinned != (tmp_path / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[1]
    cfg, port = _sshd_with_the_dropin(tmp_path)
    assert _offered_key(cfg, port) == pinned
