"""Root's configuration comes only from where root's authority reaches (alma.flash.privilege,
invariant 4), attacked with a real second user made by useradd for each test.

The issue's attacks: a user put `kas/`, `layers/` and an `alma.toml` naming their own
initrd-flash in a sticky directory above root's 0700 working directory, and root's `alma
flash` ran their script; a technician-owned checkout's `facts/` chose the bundle under sudo.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support_flash import Station, sha256

from alma.errors import UserError
from alma.flash import privilege

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a second real user (useradd) and chown")


@dataclass
class User:
    name: str
    uid: int
    gid: int

    def own(self, *paths: Path) -> None:
        for p in paths:
            os.chown(p, self.uid, self.gid, follow_symlinks=False)


@pytest.fixture
def other_user() -> Iterator[User]:
    """A real local user, unique to this test (parallel-safe), removed afterwards."""
    name = "almat" + uuid.uuid4().hex[:10]
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        import pwd

        pw = pwd.getpwnam(name)
        yield User(name, pw.pw_uid, pw.pw_gid)
    finally:
        subprocess.run(["userdel", name], check=False)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A sticky, world-writable directory like /tmp (pytest's tmp dirs are root's 0700)."""
    d = Path(tempfile.mkdtemp(prefix="alma-i32-trust-"))
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


EVIL = "#!/bin/sh\nid -u > {pwned}\necho '== Step 1: Signing binaries at x =='\necho 'Final status: SUCCESS'\n"


def _evil_script(where: Path, pwned: Path, user: User) -> Path:
    script = where / "evil-initrd-flash"
    script.write_text(EVIL.format(pwned=pwned))
    os.chmod(script, 0o755)
    user.own(script)
    return script


@root_only
def test_a_project_planted_in_a_sticky_dir_above_roots_cwd_is_refused(
    station: Station, shared: Path, other_user: User
) -> None:
    pwned = shared / "PWNED"
    for d in ("kas", "layers"):
        (shared / d).mkdir()
        other_user.own(shared / d)
    script = _evil_script(shared, pwned, other_user)
    (shared / "alma.toml").write_text(f'[tools]\ninitrd-flash = "{script}"\n')
    other_user.own(shared / "alma.toml")
    cwd = shared / "roots-own"
    cwd.mkdir(mode=0o700)  # root's private working directory, below the planted project
    b = station.bundle()
    r = subprocess.run(
        [*station_cmd(station), "flash", "--yes", "--console", "none", "--sha256", sha256(b), str(b),
         "--work-dir", str(station.work), "--records-dir", str(station.records)],
        env=station.env(ALMA_ROOT=""), capture_output=True, text=True, timeout=120, cwd=cwd, check=False,
    )  # fmt: skip
    assert not pwned.exists(), "root ran the other user's initrd-flash"
    assert r.returncode == 2, r.stderr
    assert str(shared) in r.stderr, r.stderr
    assert "writable by group and others (mode 1777, owner uid 0 (root))" in r.stderr, r.stderr
    assert "try:" in r.stderr and "Traceback" not in r.stderr


@root_only
def test_a_technicians_checkout_under_sudo_cannot_choose_the_bundle(station: Station, other_user: User) -> None:
    good = station.bundle("good")
    station.manifest(good)
    checkout = station.base / "tech-checkout"
    for d in ("kas", "layers", "facts"):
        (checkout / d).mkdir(parents=True)
    # the technician's manifest names a bundle of their choosing, with its genuine hash
    shutil.copy(station.root / "facts" / "alma-image-jetson-orin-nano-devkit.json", checkout / "facts")
    for p in [checkout, *checkout.rglob("*")]:
        other_user.own(p)
    r = subprocess.run(
        [*station_cmd(station), "flash", "--yes", "--console", "none",
         "--work-dir", str(station.work), "--records-dir", str(station.records)],
        env=station.env(ALMA_ROOT="", SUDO_UID=str(other_user.uid), SUDO_USER=other_user.name),
        capture_output=True, text=True, timeout=120, cwd=checkout, check=False,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert f"is owned by uid {other_user.uid} ({other_user.name})" in r.stderr, r.stderr
    assert station.records_list() == []  # nothing flashed, and nothing written into their checkout
    assert not (checkout / "facts" / "flash-records").exists()


@root_only
def test_a_tool_path_another_user_owns_is_refused_before_any_board(
    station: Station, shared: Path, other_user: User
) -> None:
    pwned = shared / "PWNED"
    script = _evil_script(shared, pwned, other_user)
    b = station.bundle()
    station.manifest(b)
    r = station.alma("flash", "--yes", "--console", "none", ALMA_TOOL_INITRD_FLASH=str(script))
    assert not pwned.exists()
    assert r.returncode == 2, r.stderr
    assert "ALMA_TOOL_INITRD_FLASH" in r.stderr and f"owned by uid {other_user.uid}" in r.stderr, r.stderr
    assert [x["result"] for x in station.records_list()] == ["REFUSED"]


def test_the_configured_program_is_the_one_that_was_checked(tmp_path: Path) -> None:
    prog = tmp_path / "flasher"
    prog.write_text("#!/bin/sh\necho ok\n")
    os.chmod(prog, 0o755)
    checked = privilege.CheckedProgram.of(prog, "tool", "fix")
    checked.reverify()
    prog.write_text("#!/bin/sh\nid -u > /tmp/pwned\n")  # same inode, other bytes
    with pytest.raises(UserError, match="changed since it was checked"):
        checked.reverify()
    other = tmp_path / "other"
    other.write_text("#!/bin/sh\necho ok\n")
    os.chmod(other, 0o755)
    os.rename(other, prog)  # the checked bytes again, but another inode
    with pytest.raises(UserError, match="changed since it was checked"):
        checked.reverify()


def station_cmd(station: Station) -> list[str]:
    """`alma` under umockdev with the recorded Orin Nano in recovery mode (as Station.alma)."""
    import sys

    from support import require_tool
    from support_flash import DEVICES

    umockdev = require_tool("umockdev-run")
    return [umockdev, "--device", str(DEVICES / "apx-7523-orin-nano-8gb.umockdev"), "--", sys.executable, "-m", "alma"]
