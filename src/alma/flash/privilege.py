"""Who may write what on a flashing station: the places ``alma flash`` (often root) writes
and executes from are ones no other user can write, rename or replace.

Invariants (tests/flash/test_privilege.py attacks each, with a real second uid):

1. **Trusted bases.** The work base (``--work-dir``), the records dir and every one of their
   ancestors is owned by root or the runner and is not writable by group or others; a
   sticky directory (``/tmp``) is the one exception, and only as an ancestor whose child on
   the path is ours (another user cannot rename or remove what is not theirs in it). A base
   that fails is refused up front (exit 2, a REFUSED record) with the owner, the mode and
   the fix. The check runs on the resolved path and the resolved path is what is used
   afterwards, so a symlink another user controls cannot re-aim it later.
2. **Private run dirs.** ``run-*`` (mkdtemp, 0700), the unpacked tree and each board's copy
   are created by alma, owned by the runner, mode 0700: nobody else can read, rename or
   replace anything in them.
3. **The script that runs is the one that was hashed.** The sha256 of ``initrd-flash`` is
   taken from the archive's bytes while they are unpacked (the bundle's own sha256 covers
   them). Right before the flash, the board's copy is opened relative to its directory's
   fd with ``O_NOFOLLOW``, fstat'ed (a regular file owned by the runner, no group/other
   write, in a 0700 directory of the runner's) and hashed again; any difference is a
   refusal and nothing runs.
4. **Configuration from where the runner's authority reaches.** When alma runs as root, or
   reads a place that is not the runner's own, the project root (walked up from the cwd or
   ``ALMA_ROOT``), ``alma.toml``, facts manifests and any tool path they or ``ALMA_TOOL_*``
   name must be root's or the runner's, not group/other writable, and so must every
   ancestor (a sticky one like ``/tmp`` excepted). Anything else is refused (exit 2) with
   the owner, the mode and the fix: never silently skipped, so root never flashes with a
   configuration it did not choose. A configured tool is hashed when checked and its inode
   and hash are checked again right before it is run.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from alma.errors import UserError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
SCRIPT = "initrd-flash"


class UntrustedPath(UserError):
    """A place another user could write or rename in. Exit 2."""


def _who(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def _chain_problem(real: Path, me: int) -> str | None:
    """Why ``real`` (existing) or an ancestor lets another user write or own it, or None.

    ``real`` itself must be root's or the runner's and not group/other writable; an
    ancestor may be a sticky shared directory (``/tmp``): nobody renames what is not theirs.
    """
    for i, d in enumerate([real, *real.parents]):
        st = os.stat(d)
        if st.st_uid not in (0, me):
            return f"{d} is owned by {_who(st.st_uid)}"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (st.st_mode & stat.S_ISVTX and i > 0):
            who = " and ".join(w for bit, w in ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others")) if st.st_mode & bit)
            return f"{d} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}, owner {_who(st.st_uid)})"
    return None


def trusted_base(path: Path, what: str, option: str) -> Path:
    """The resolved ``path`` if it and every ancestor are the runner's or root's (see 1.)."""
    me = os.geteuid()
    real = Path(os.path.realpath(path))
    existing = real
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the missing tail is created by alma (0700, the runner's)
    fix = (
        f"use {option} on a directory owned by {'root' if me == 0 else 'you'} that no other user can write "
        f"(e.g. {option} /var/lib/alma/flash, created by root with mode 0700)"
    )
    problem = _chain_problem(existing, me)
    if problem is None:
        return real
    if "owned by" in problem:
        raise UntrustedPath(
            f"{what} {real}: {problem}, who could rename or replace what alma "
            "creates there (and make it run their initrd-flash); refused, nothing was flashed",
            hint=fix,
        )
    raise UntrustedPath(
        f"{what} {real}: {problem}: another user could rename or replace what alma "
        "creates there; refused, nothing was flashed",
        hint=fix,
    )


def must_check_config(path: Path) -> bool:
    """Invariant 4 applies: the runner is root, or ``path`` is not the runner's own."""
    me = os.geteuid()
    if me == 0:
        return True
    try:
        return os.stat(path).st_uid != me
    except OSError:
        return False


def trusted_config(path: Path, what: str, fix: str) -> Path:
    """The resolved ``path`` (a project root, alma.toml, a manifest, a tool) when no other
    user can write, own or replace it or anything above it (invariant 4); else refused."""
    real = Path(os.path.realpath(path))
    existing = real
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # a missing tool fails when run; who may create it is judged here
    if not must_check_config(existing):
        return real
    problem = _chain_problem(existing, os.geteuid())
    if problem is not None:
        runner = "root" if os.geteuid() == 0 else _who(os.geteuid())
        raise UntrustedPath(
            f"{what} {real}: {problem}, so another user chooses what {runner} reads or runs from it; refused",
            hint=fix,
        )
    return real


@dataclass(frozen=True)
class CheckedProgram:
    """A program file judged trusted (invariant 4) and what it was: re-checked right before exec."""

    path: Path
    dev: int
    ino: int
    sha256: str

    @classmethod
    def of(cls, path: Path, what: str, fix: str) -> CheckedProgram:
        real = trusted_config(path, what, fix)
        dev, ino, sha = _open_and_hash(real, what, fix)
        return cls(real, dev, ino, sha)

    def reverify(self) -> None:
        """The file at ``path`` is still the inode and the bytes that were checked."""
        fix = "check who else can write there, then run alma flash again"
        dev, ino, sha = _open_and_hash(self.path, "program", fix)
        if (dev, ino, sha) != (self.dev, self.ino, self.sha256):
            raise UntrustedPath(
                f"{self.path}: changed since it was checked (sha256 {sha}, was {self.sha256}); refused to run it",
                hint=fix,
            )


def _open_and_hash(path: Path, what: str, fix: str) -> tuple[int, int, str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise UntrustedPath(f"{what} {path}: cannot be opened ({exc.strerror or exc})", hint=fix) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedPath(f"{what} {path}: not a regular file", hint=fix)
        return st.st_dev, st.st_ino, sha256_fd(fd)
    finally:
        os.close(fd)


def sha256_fd(fd: int) -> str:
    h = hashlib.sha256()
    while chunk := os.read(fd, 1 << 20):
        h.update(chunk)
    return h.hexdigest()


def check_private_dir(fd: int, where: Path) -> None:
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        raise UntrustedPath(
            f"{where} is not private to alma (owner {_who(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o}); "
            "refused to run anything from it",
            hint="run alma flash again (it makes a new private work dir)",
        )


def verify_script(run_dir: Path, board_dir: Path, expected_sha256: str) -> None:
    """Invariant 3: ``board_dir/initrd-flash`` is the runner's, private, and has the hashed bytes.

    Every directory from ``run_dir`` down to ``board_dir`` is opened relative to the previous
    one's fd (``O_NOFOLLOW``) and must be the runner's, mode 0700.
    """
    rel = board_dir.relative_to(run_dir)
    fd = os.open(run_dir, _DIR_FLAGS)
    try:
        check_private_dir(fd, run_dir)
        here = run_dir
        for part in rel.parts:
            nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
            here = here / part
            check_private_dir(fd, here)
        sfd = os.open(SCRIPT, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
    except OSError as exc:
        raise UntrustedPath(
            f"{board_dir / SCRIPT}: cannot be opened as alma's own copy ({exc.strerror or exc}); refused to run it",
            hint="run alma flash again",
        ) from exc
    finally:
        os.close(fd)
    try:
        st = os.fstat(sfd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise UntrustedPath(
                f"{board_dir / SCRIPT}: not a private regular file of alma's (owner {_who(st.st_uid)}, mode "
                f"{stat.S_IMODE(st.st_mode):04o}); refused to run it",
                hint="run alma flash again",
            )
        got = sha256_fd(sfd)
    finally:
        os.close(sfd)
    if got != expected_sha256:
        raise UntrustedPath(
            f"{board_dir / SCRIPT}: sha256 {got} is not the {expected_sha256} the verified bundle carried; "
            "refused to run it (something changed it after the unpack)",
            hint="check who else runs as root on this station, then run alma flash again",
        )
