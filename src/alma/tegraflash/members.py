"""The one set of member checks, shared by ``scan`` (verify) and ``unpack`` (flash).

A bundle is attacker-controlled. ``MemberChecker.check`` judges each tar member as it
streams past and ``finish`` judges the symlinks once every member is known; both raise
:class:`UnsafeBundle` (exit 2). What is refused (docs/flash.md#bundle-threat-model):

- names: absolute, ``..`` components, NUL, a component over NAME_MAX (255 bytes), a path over
  PATH_MAX (4095 bytes) or deeper than MAX_DEPTH, more than MAX_MEMBERS members or names
  (members and the directories their paths imply);
- types other than regular file, directory, symlink and hard link (devices, fifos, ...);
- duplicates, and a member replacing a directory or a file (the same name twice, unless
  it is a directory both times);
- a member *under* anything but a directory (nothing is ever written through a link or a file);
- hard links whose target is not a regular file earlier in the archive (links to links,
  to symlinks, to directories, to outside, through a link);
- symlinks with an absolute target or one that, resolved through the archive's own final
  tree (chains included, at most MAX_HOPS hops, each link resolved once), leaves it;
- apparent sizes over MAX_APPARENT (sparse files keep their holes; data is bounded by
  the unpack budget, :mod:`.unpack`).

Setuid/setgid/sticky bits and group/other write are stripped (:func:`safe_mode`), owners
are never applied.
"""

from __future__ import annotations

import stat
import tarfile
from dataclasses import dataclass, field

from alma.errors import UserError

NAME_MAX = 255
PATH_MAX = 4095
MAX_DEPTH = 64
MAX_MEMBERS = 200_000
MAX_HOPS = 40
MAX_APPARENT = 4 << 40  # 4 TiB: far above any Orin storage device

FILE, DIR, SYMLINK, HARDLINK = "file", "dir", "symlink", "hardlink"
_HINT = "rebuild the bundle, or copy it again from the build host (alma verify shows its sha256)"


class UnsafeBundle(UserError):
    """A bundle member that must not be unpacked. Exit 2."""

    def __init__(self, why: str) -> None:
        super().__init__(f"{why}; refused to unpack it", hint=_HINT)
        self.why = why


@dataclass
class Member:
    name: str  # normalised: no leading "./", no empty or "." components; "" is the root
    kind: str  # FILE | DIR | SYMLINK | HARDLINK
    size: int = 0  # apparent size (sparse files: with holes)
    data_size: int = 0  # bytes stored in the archive (what the unpack writes)
    mode: int = 0o644  # already made safe
    mtime: int = 0
    linkname: str = ""  # symlink: raw target; hard link: normalised target
    sparse: list[tuple[int, int]] | None = None
    offset_data: int = 0

    @property
    def parts(self) -> list[str]:
        return self.name.split("/") if self.name else []


def safe_mode(mode: int, kind: str) -> int:
    """No setuid/setgid/sticky, no group/other write; the owner can always read (and write)."""
    base = stat.S_IMODE(mode) & 0o755
    return base | (0o700 if kind == DIR else 0o600)


def normalise(name: str, what: str = "member") -> str:
    shown = repr(name[:120])
    if "\0" in name:
        raise UnsafeBundle(f"{what} {shown} has a NUL in its name")
    if name.startswith("/"):
        raise UnsafeBundle(f"{what} {shown} has an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeBundle(f"{what} {shown} climbs out with '..'")
    if len(name.encode("utf-8", "surrogateescape")) > PATH_MAX:
        raise UnsafeBundle(f"{what} {shown}...: path longer than {PATH_MAX} bytes")
    for p in parts:
        if len(p.encode("utf-8", "surrogateescape")) > NAME_MAX:
            raise UnsafeBundle(f"{what} {shown}: a path component longer than {NAME_MAX} bytes")
    if len(parts) > MAX_DEPTH:
        raise UnsafeBundle(f"{what} {shown}: nested deeper than {MAX_DEPTH} directories")
    return "/".join(parts)


@dataclass
class MemberChecker:
    kinds: dict[str, str] = field(default_factory=lambda: {"": DIR})
    symlinks: dict[str, str] = field(default_factory=dict)  # name -> raw target
    _resolved: dict[str, tuple[str, ...]] = field(default_factory=dict)  # symlink -> where it leads
    count: int = 0
    data_total: int = 0

    def _parents_are_dirs(self, name: str, who: str) -> None:
        cut = name.find("/")
        while cut >= 0:
            parent = name[:cut]
            cut = name.find("/", cut + 1)
            kind = self.kinds.get(parent)
            if kind is None:
                # implied, as tar does; counted like members (a 0.1 MB bundle of deep, distinct
                # paths implied 1.2 million directories: 266 MB)
                if len(self.kinds) >= MAX_MEMBERS:
                    raise UnsafeBundle(f"more than {MAX_MEMBERS} names (members and the directories they imply)")
                self.kinds[parent] = DIR
            elif kind != DIR:
                raise UnsafeBundle(
                    f"member {who!r} lies under {parent!r}, which the archive made a {kind}: "
                    "nothing is written through a link or a file"
                )

    def check(self, ti: tarfile.TarInfo) -> Member | None:
        """The checked member, or None for the archive's root entry (``./``)."""
        self.count += 1
        if self.count > MAX_MEMBERS:
            raise UnsafeBundle(f"more than {MAX_MEMBERS} members")
        name = normalise(ti.name)
        if ti.isreg():
            kind = FILE
        elif ti.isdir():
            kind = DIR
        elif ti.issym():
            kind = SYMLINK
        elif ti.islnk():
            kind = HARDLINK
        elif ti.ischr() or ti.isblk() or ti.isfifo():
            raise UnsafeBundle(f"member {ti.name!r} is a device or fifo")
        else:
            raise UnsafeBundle(f"member {ti.name!r} has an unsupported type {ti.type!r}")
        if not name:
            if kind != DIR:
                raise UnsafeBundle(f"member {ti.name!r} would replace the unpack directory itself")
            return None
        self._parents_are_dirs(name, name)
        old = self.kinds.get(name)
        if old is not None and not (old == DIR and kind == DIR):
            what = "replaces the directory" if old == DIR else f"duplicates an earlier {old}"
            raise UnsafeBundle(f"member {name!r} {what} of the same name")
        m = Member(name=name, kind=kind, mode=safe_mode(ti.mode, kind), mtime=max(0, int(ti.mtime)))
        if kind == FILE:
            if ti.size < 0 or ti.size > MAX_APPARENT:
                raise UnsafeBundle(f"member {name!r} claims {ti.size} bytes")
            m.size = ti.size
            sparse = getattr(ti, "sparse", None)
            if sparse:
                m.sparse = [(int(o), int(n)) for o, n in sparse]
                if any(o < 0 or n < 0 or o + n > ti.size for o, n in m.sparse):
                    raise UnsafeBundle(f"member {name!r} has a sparse map outside its size")
                m.data_size = sum(n for _, n in m.sparse)
            else:
                m.data_size = ti.size
            m.offset_data = ti.offset_data
            self.data_total += m.data_size
        elif kind == HARDLINK:
            target = normalise(ti.linkname, f"hard link {name!r} ->")
            if self.kinds.get(target) != FILE:
                raise UnsafeBundle(
                    f"member {name!r} is a hard link to {ti.linkname!r}, which is not a regular file "
                    "earlier in the archive"
                )
            m.linkname = target
        elif kind == SYMLINK:
            if "\0" in ti.linkname or not ti.linkname:
                raise UnsafeBundle(f"symlink {name!r} has an empty or NUL target")
            if ti.linkname.startswith("/"):
                raise UnsafeBundle(f"symlink {name!r} -> {ti.linkname!r} points outside the bundle (absolute)")
            if len(ti.linkname.encode("utf-8", "surrogateescape")) > PATH_MAX:
                raise UnsafeBundle(f"symlink {name!r}: target longer than {PATH_MAX} bytes")
            m.linkname = ti.linkname
            self.symlinks[name] = ti.linkname
        self.kinds[name] = kind
        return m

    def _resolve(self, start: tuple[str, ...], target: str, hops: int, link: str) -> tuple[str, ...]:
        """Resolve ``target`` from directory ``start`` through the archive's own symlinks.

        Linear in the archive's link text: each symlink is resolved once (``_resolved``), so
        links naming links many times over (``a1 -> a0/a0/a0...``, ``a2 -> a1/a1/a1...``)
        cost their length, not its power; a walk deeper than MAX_DEPTH names no member.
        """
        if hops > MAX_HOPS:
            raise UnsafeBundle(f"symlink {link!r}: more than {MAX_HOPS} links in a chain")
        cur = start
        for comp in target.split("/"):
            if comp in ("", "."):
                continue
            if comp == "..":
                if not cur:
                    raise UnsafeBundle(f"symlink {link!r} -> {self.symlinks[link]!r} points outside the bundle")
                cur = cur[:-1]
                continue
            cur = (*cur, comp)
            if len(cur) > MAX_DEPTH:
                raise UnsafeBundle(f"symlink {link!r} resolves deeper than {MAX_DEPTH} directories")
            here = "/".join(cur)
            inner = self.symlinks.get(here)
            if inner is not None:
                if inner.startswith("/"):
                    raise UnsafeBundle(f"symlink {link!r} leads to an absolute link {here!r}")
                done = self._resolved.get(here)
                if done is None:
                    done = self._resolved[here] = self._resolve(cur[:-1], inner, hops + 1, link)
                cur = done
        return cur

    def finish(self) -> None:
        """Judge every symlink against the final tree (all members are known now)."""
        for name in self.symlinks:
            self._resolve(tuple(name.split("/")[:-1]), self.symlinks[name], 0, name)
