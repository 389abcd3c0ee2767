"""The build tree, defined once: where kas and bitbake put everything ``alma build`` makes.

``alma build`` runs kas with ``KAS_WORK_DIR = <build dir>`` and ``KAS_BUILD_DIR =
<build dir>/<machine>``, so (default build dir ``<checkout>/build``; an exported
``KAS_WORK_DIR``, ``KAS_BUILD_DIR``, ``DL_DIR`` or ``SSTATE_DIR`` wins over its default,
``--build-dir`` over an exported ``KAS_WORK_DIR``)::

    build/<repo>/                              repositories kas checks out (bitbake, openembedded-core, ...)
    build/downloads/                           DL_DIR, shared by every machine
    build/sstate-cache/                        SSTATE_DIR, shared by every machine
    build/<machine>/                           TOPDIR of that machine: conf/, the bitbake server, logs
    build/<machine>/<tmp>/                     TMPDIR: tmp-glibc (oe-core's TCLIBCAPPEND for a non-poky
                                               distro such as alma), or tmp when a distro clears it
    build/<machine>/<tmp>/deploy/images/<machine>/   DEPLOY_DIR_IMAGE: what ``alma verify`` reads

bitbake's TMPDIR moves out of the tree when the kas files set it (``local_conf_header``) or
``TMPDIR`` is exported (kas passes it to bitbake, listed in BB_ENV_PASSTHROUGH_ADDITIONS):
then it is ``<that>-glibc`` (oe-core appends TCLIBCAPPEND after local.conf), shared by every
machine, and ``alma build`` records it in ``build/<machine>/alma-build-tree.json`` so that
``alma verify`` looks there whatever its own environment says.

``alma build`` (plan), ``alma verify`` (deploy dirs), ``alma flash`` (through the facts
manifest's ``bundle_path``, written from here) and the gate documents all take their paths
from this module; docs/architecture.md shows the same tree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

BUILD_DIR_NAME = "build"
DEFAULT_MACHINE = "jetson-orin-nano-devkit"
DEFAULT_IMAGE = "alma-image"
# oe-core scarthgap: TMPDIR ?= "${TOPDIR}/tmp", then defaultsetup.conf appends TCLIBCAPPEND
# ("-glibc") unless the distro clears it (poky does; alma does not).
TMPDIR_NAMES = ("tmp-glibc", "tmp")
DOWNLOADS = "downloads"
SSTATE = "sstate-cache"


def with_tclibcappend(tmpdir: str) -> Path:
    """bitbake's TMPDIR once oe-core has appended TCLIBCAPPEND: a string concatenation, so a
    TMPDIR written ``/x/`` becomes ``/x/-glibc`` (a directory inside /x), not ``/x-glibc``."""
    return Path(f"{tmpdir}-glibc")


def as_written(tmpdir: str) -> str:
    """An exported TMPDIR as bitbake will concatenate it: kept as written when absolute (only
    a relative one is made absolute, keeping a trailing '/')."""
    if tmpdir.startswith("/"):
        return tmpdir
    return os.path.abspath(tmpdir) + ("/" if tmpdir.endswith("/") else "")


# What kas (and bitbake) take from the environment. An exported value wins over the default
# tree (docs/shared-builds.md): a shared DL_DIR/SSTATE_DIR, or a work dir on another disk.
ENV_NAMES = ("KAS_WORK_DIR", "KAS_BUILD_DIR", "DL_DIR", "SSTATE_DIR")


@dataclass(frozen=True)
class BuildTree:
    work_dir: Path  # KAS_WORK_DIR
    downloads_dir: Path | None = None  # DL_DIR when exported (else <work_dir>/downloads)
    sstate_dir: Path | None = None  # SSTATE_DIR when exported (else <work_dir>/sstate-cache)
    build_dir: Path | None = None  # KAS_BUILD_DIR when exported (else <work_dir>/<machine>)
    tmp_dir: str | None = None  # bitbake's TMPDIR as written, before TCLIBCAPPEND, when not <TOPDIR>/tmp
    sources: tuple[tuple[str, str], ...] = ()  # (name, where its value came from)

    @property
    def downloads(self) -> Path:
        return self.downloads_dir or self.work_dir / DOWNLOADS

    @property
    def sstate(self) -> Path:
        return self.sstate_dir or self.work_dir / SSTATE

    def source(self, name: str) -> str:
        return dict(self.sources).get(name, "default")

    def repo_dir(self, name: str) -> Path:
        return self.work_dir / name

    def machine_dir(self, machine: str) -> Path:
        """KAS_BUILD_DIR (bitbake's TOPDIR) for ``machine``: the exported one, else per machine."""
        return self.build_dir or self.work_dir / machine

    def tmp_dirs(self, machine: str) -> list[Path]:
        """Where bitbake's TMPDIR of ``machine`` can be, most likely first: this tree's TMPDIR
        (exported or the kas files'), the one the last build of ``machine`` recorded, then the
        default under TOPDIR; each with and without TCLIBCAPPEND's ``-glibc``."""
        recorded = read_record(self.machine_dir(machine) / TREE_RECORD) or {}
        bases = [self.tmp_dir, recorded["TMPDIR"] if recorded.get("TMPDIR", "").startswith("/") else None]
        out: list[Path] = []
        for tmp in dict.fromkeys(b for b in bases if b is not None):
            out += [with_tclibcappend(tmp), Path(tmp)]
        return out + [self.machine_dir(machine) / t for t in TMPDIR_NAMES]

    def bitbake_tmpdir(self, machine: str) -> Path:
        """bitbake's TMPDIR for a build of ``machine`` with this tree (the ALMA distro keeps
        TCLIBCAPPEND): what the disk check measures."""
        tmp = self.tmp_dir
        return with_tclibcappend(tmp) if tmp else self.machine_dir(machine) / TMPDIR_NAMES[0]

    def deploy_dirs(self, machine: str) -> list[Path]:
        """Every place DEPLOY_DIR_IMAGE of ``machine`` can be, most likely first."""
        return [t / "deploy" / "images" / machine for t in self.tmp_dirs(machine)]

    def deploy_dir(self, machine: str) -> Path | None:
        """The deploy dir a build of ``machine`` made, or None."""
        return next((d for d in self.deploy_dirs(machine) if d.is_dir()), None)

    def built(self) -> dict[str, Path]:
        """machine -> deploy dir, for every machine this tree holds a deploy dir of."""
        out: dict[str, Path] = {}
        if not self.work_dir.is_dir():
            return out
        for mdir in sorted(p for p in self.work_dir.iterdir() if p.is_dir()):
            found = self.deploy_dir(mdir.name)
            if found is not None:
                out[mdir.name] = found
        return out

    def env(self) -> dict[str, str]:
        """What kas is given so that it lays the tree out as above (KAS_BUILD_DIR is per machine)."""
        return {"KAS_WORK_DIR": str(self.work_dir), "DL_DIR": str(self.downloads), "SSTATE_DIR": str(self.sstate)}


def build_tree(
    root: Path,
    build_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
    kas_env: Mapping[str, str] | None = None,
    kas_tmpdir: str | None = None,
) -> BuildTree:
    """The tree of checkout ``root``.

    Precedence, for each directory: ``--build-dir`` (the work dir only), then the exported
    variable (``env``: KAS_WORK_DIR, KAS_BUILD_DIR, DL_DIR, SSTATE_DIR), then for DL_DIR and
    SSTATE_DIR the kas files' ``env:`` (``kas_env``: kas exports those values to bitbake
    unless the environment has one, kas/libkas.py get_build_environ), then the default under
    ``<root>/build``. bitbake's TMPDIR: the kas files' (``kas_tmpdir``: local.conf beats the
    environment), else an exported ``TMPDIR``, else ``<TOPDIR>/tmp``. ``sources`` records
    which one won, for the plan.
    """
    env = {} if env is None else env
    kas_env = {} if kas_env is None else kas_env

    def exported(name: str) -> Path | None:
        value = env.get(name, "").strip()
        return Path(value).expanduser().resolve() if value else None

    def from_kas(name: str) -> Path | None:
        value = kas_env.get(name, "").strip() if name in ("DL_DIR", "SSTATE_DIR") else ""
        return Path(value).expanduser().resolve() if value else None

    sources: list[tuple[str, str]] = []
    from_env = exported("KAS_WORK_DIR")
    if build_dir:
        work, how = Path(build_dir).resolve(), "--build-dir"
    elif from_env is not None:
        work, how = from_env, "environment"
    else:
        work, how = (Path(root) / BUILD_DIR_NAME).resolve(), "default"
    sources.append(("KAS_WORK_DIR", how))
    dirs: dict[str, Path | None] = {}
    for name in ("KAS_BUILD_DIR", "DL_DIR", "SSTATE_DIR"):
        dirs[name] = exported(name)
        how = "environment" if dirs[name] else ("--build-dir" if build_dir else "default")
        if dirs[name] is None and from_kas(name) is not None:
            dirs[name], how = from_kas(name), "kas files env:"
        sources.append((name, how))
    # not resolved: bitbake makes "<TMPDIR as written>-glibc", beside a link, not beside its target
    tmp_env = env.get("TMPDIR", "").strip()
    tmp = kas_tmpdir if kas_tmpdir is not None else as_written(tmp_env) if tmp_env else None
    sources.append(("TMPDIR", "kas files local_conf_header" if kas_tmpdir else "environment" if tmp else "default"))
    return BuildTree(
        work,
        downloads_dir=dirs["DL_DIR"],
        sstate_dir=dirs["SSTATE_DIR"],
        build_dir=dirs["KAS_BUILD_DIR"],
        tmp_dir=tmp,
        sources=tuple(sources),
    )


# build/<machine>/alma-build-tree.json: the directories the last alma build of that machine
# gave kas (its plan's environment), so alma verify reads DL_DIR where the build had it
TREE_RECORD = "alma-build-tree.json"
_RECORD_MAX = 64 << 10


def read_record(record: Path) -> dict[str, str] | None:
    """A TREE_RECORD: name -> value, or None when there is none, it is not ours (another
    user's file: a TMPDIR's parent may be a shared directory), another user could have
    written it (a link, group/other-writable) or not the shape we write. The checks are on
    the opened file, so the file judged is the file read."""
    import json
    import stat

    try:
        fd = os.open(record, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
                return None
            if st.st_size > _RECORD_MAX:
                return None
            data = json.loads(fh.read(_RECORD_MAX).decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        return None
    return data


def recorded_env(
    deploy: Path, tree: BuildTree | None = None, machine: str | None = None
) -> tuple[dict[str, str], Path] | None:
    """The environment the build that made ``deploy`` (``<TOPDIR>/<tmp>/deploy/images/<machine>``)
    ran with, from its TOPDIR's record (or, for a TMPDIR outside TOPDIR, the record of
    ``machine`` in ``tree`` that names that TMPDIR); None when there is none or it is not ours."""
    parents = Path(deploy).resolve().parents
    if len(parents) < 4:
        return None
    candidates = [parents[3] / TREE_RECORD]
    if tree is not None and machine is not None:
        candidates.insert(0, tree.machine_dir(machine) / TREE_RECORD)
    for record in candidates:
        data = read_record(record)
        if data is None:
            continue
        tmp = data.get("TMPDIR") or ""  # as bitbake was given it: through links, which deploy's parents are not
        made_there = bool(tmp) and parents[2] in {Path(tmp).resolve(), with_tclibcappend(tmp).resolve()}
        if record == parents[3] / TREE_RECORD or made_there:
            return data, record
    return None


def deploy_dir_hint(machine: str) -> str:
    """The deploy dir of ``machine`` relative to the checkout, as docs and hints write it."""
    return f"{BUILD_DIR_NAME}/{machine}/{TMPDIR_NAMES[0]}/deploy/images/{machine}"
