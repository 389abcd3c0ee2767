"""The station's privilege model (alma.flash.privilege) attacked with a real second user.

The issue's attack: a local user who owns `--work-dir` watched root's 0700 `run-*` dir,
swapped it after the verified unpack, and root ran that user's initrd-flash (uid=0 written
to a file, exit 0, a SUCCESS record with the genuine sha256). Here a process with another
uid (54321, via setuid) races the same swap; run as root (CI is root), skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support_flash import Station

from alma.errors import UserError
from alma.flash import privilege

ATTACKER = 54321
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a second real uid (setuid) races alma flash")

# The attacker's process: finds root's run-* in the shared base and tries to put its own
# tree (whose initrd-flash writes `id -u` to PWNED) in its place, as in the issue.
RACER = r"""
import json, os, sys, time
base, pwned, report, stop = sys.argv[1:5]
tries = swaps = 0
errors = set()
evil = "#!/bin/sh\nid -u > " + pwned + "\necho 'Final status: SUCCESS'\n"
while not os.path.exists(stop):
    try:
        names = [n for n in os.listdir(base) if n.startswith("run-") and not n.endswith(".old")
                 and os.lstat(os.path.join(base, n)).st_uid != os.getuid()]
    except OSError as exc:
        errors.add(type(exc).__name__); names = []
    for n in names:
        tries += 1
        run = os.path.join(base, n)
        try:
            os.rename(run, run + ".old")
            for sub in ("bundle", "boards/1-3"):
                os.makedirs(os.path.join(run, sub), exist_ok=True)
                with open(os.path.join(run, sub, "initrd-flash"), "w") as fh:
                    fh.write(evil)
                os.chmod(os.path.join(run, sub, "initrd-flash"), 0o755)
            swaps += 1
        except OSError as exc:
            errors.add(type(exc).__name__)
    try:  # and plant a run dir of its own, in case root reuses one
        os.mkdir(os.path.join(base, "run-planted"))
        swaps += 1
    except FileExistsError:
        pass
    except OSError as exc:
        errors.add(type(exc).__name__)
    time.sleep(0.001)
json.dump({"tries": tries, "swaps": swaps, "errors": sorted(errors)}, open(report, "w"))
"""


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    """A directory both users can reach (pytest's own tmp dirs are 0700 root)."""
    d = Path(tempfile.mkdtemp(prefix="alma-i18-priv-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Racer:
    def __init__(self, base: Path, shared: Path) -> None:
        self.box = shared / "attacker"
        self.box.mkdir()
        os.chown(self.box, ATTACKER, ATTACKER)
        self.pwned = self.box / "PWNED"
        self.report = self.box / "report.json"
        self.stop_file = self.box / "stop"
        # the system interpreter: a venv under /root is not reachable by another uid
        python = next((p for p in ("/usr/bin/python3", sys.executable) if os.access(p, os.X_OK)), sys.executable)
        self.proc = subprocess.Popen(
            [python, "-c", RACER, str(base), str(self.pwned), str(self.report), str(self.stop_file)],
            user=ATTACKER,
            group=ATTACKER,
            extra_groups=[],
            cwd="/",
        )

    def stop(self) -> dict[str, object]:
        self.stop_file.touch()
        self.proc.wait(timeout=30)
        out: dict[str, object] = json.loads(self.report.read_text())
        return out


def _flash(station: Station, work: Path) -> subprocess.CompletedProcess[str]:
    b = station.bundle()
    station.manifest(b)
    return station.alma("flash", "--yes", "--console", "none", "--work-dir", str(work), SIM_DELAY="0.05")


@root_only
def test_a_work_dir_owned_by_another_user_is_refused_while_they_race_the_swap(station: Station, shared: Path) -> None:
    work = shared / "work"
    work.mkdir()
    os.chown(work, ATTACKER, ATTACKER)
    racer = Racer(work, shared)
    try:
        r = _flash(station, work)
    finally:
        report = racer.stop()
    assert r.returncode == 2, r.stderr
    assert f"is owned by uid {ATTACKER}" in r.stderr and "--work-dir" in r.stderr and "Traceback" not in r.stderr
    assert not racer.pwned.exists()  # the attacker's script never ran
    assert [p.name for p in work.iterdir()] == ["run-planted"]  # root created nothing there
    recs = station.records_list()
    assert [x["result"] for x in recs] == ["REFUSED"] and f"uid {ATTACKER}" in str(recs[0]["reason"])
    assert report["tries"] == 0  # there was no run-* of root's to swap


@root_only
def test_a_second_user_racing_a_root_owned_work_dir_finds_nothing_to_swap(station: Station, shared: Path) -> None:
    work = shared / "work"
    work.mkdir(mode=0o755)
    racer = Racer(work, shared)
    try:
        time.sleep(0.2)
        r = _flash(station, work)
    finally:
        report = racer.stop()
    assert r.returncode == 0, r.stderr
    assert not racer.pwned.exists()
    assert report["tries"] > 0 and report["swaps"] == 0 and "PermissionError" in report["errors"], report
    assert [x["result"] for x in station.records_list()] == ["SUCCESS"]


@root_only
def test_a_records_dir_another_user_controls_is_refused_before_any_record(station: Station, shared: Path) -> None:
    recs = shared / "records"
    recs.mkdir()
    os.chown(recs, ATTACKER, ATTACKER)
    b = station.bundle()
    station.manifest(b)
    r = station.alma("flash", "--yes", "--console", "none", "--records-dir", str(recs / "sub"))
    assert r.returncode == 2 and "records dir" in r.stderr and f"uid {ATTACKER}" in r.stderr, r.stderr
    assert not (recs / "sub").exists()


def test_trusted_base_rules(tmp_path: Path, shared: Path) -> None:
    me = os.geteuid()
    ok = tmp_path / "a" / "b"  # missing tail: created later by alma
    assert privilege.trusted_base(ok, "work dir", "--work-dir") == ok.resolve()
    open_dir = shared / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(UserError, match="writable by (group|others)"):
        privilege.trusted_base(open_dir / "work", "work dir", "--work-dir")
    sticky = shared / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    (sticky / "mine").mkdir(mode=0o700)
    assert privilege.trusted_base(sticky / "mine", "work dir", "--work-dir")  # /tmp-like ancestor: fine
    with pytest.raises(UserError, match="writable by (group|others)"):
        privilege.trusted_base(sticky, "work dir", "--work-dir")  # the base itself may not be shared
    # a symlink is judged by where it leads, and that is what is used afterwards
    (tmp_path / "link").symlink_to(open_dir)
    with pytest.raises(UserError):
        privilege.trusted_base(tmp_path / "link" / "work", "work dir", "--work-dir")
    if me == 0:
        theirs = shared / "theirs"
        theirs.mkdir()
        os.chown(theirs, ATTACKER, ATTACKER)
        with pytest.raises(UserError, match=f"owned by uid {ATTACKER}"):
            privilege.trusted_base(theirs / "deep" / "er", "work dir", "--work-dir")


def _board(tmp_path: Path, content: bytes = b"#!/bin/sh\necho hi\n") -> tuple[Path, Path, str]:
    run = tmp_path / "run-x"
    board = run / "boards" / "1-3"
    board.mkdir(parents=True, mode=0o700)
    os.chmod(run, 0o700)
    os.chmod(run / "boards", 0o700)
    (board / "initrd-flash").write_bytes(content)
    os.chmod(board / "initrd-flash", 0o755)
    import hashlib

    return run, board, hashlib.sha256(content).hexdigest()


def test_the_script_that_runs_must_be_the_one_that_was_hashed(tmp_path: Path) -> None:
    run, board, sha = _board(tmp_path)
    privilege.verify_script(run, board, sha)
    (board / "initrd-flash").write_bytes(b"#!/bin/sh\nid -u > /tmp/pwned\n")
    with pytest.raises(UserError, match="sha256"):
        privilege.verify_script(run, board, sha)


def test_a_script_swapped_for_a_link_or_a_dir_opened_by_others_is_refused(tmp_path: Path) -> None:
    run, board, sha = _board(tmp_path)
    (tmp_path / "real").write_bytes((board / "initrd-flash").read_bytes())
    (board / "initrd-flash").unlink()
    (board / "initrd-flash").symlink_to(tmp_path / "real")
    with pytest.raises(UserError, match="cannot be opened"):  # O_NOFOLLOW: a link is never run
        privilege.verify_script(run, board, sha)
    run2, board2, sha2 = _board(tmp_path / "2")
    os.chmod(board2, 0o755)
    with pytest.raises(UserError, match="not private"):
        privilege.verify_script(run2, board2, sha2)
