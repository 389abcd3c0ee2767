"""Checks before anything slow: host tools, kas, disk, RAM, user, locale, network.

Every check returns problems as ``(what is missing, the command that fixes it)`` and all of
them run, so the user sees every problem at once. The machine is reached only through
``Probes``, whose fields tests replace.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from alma import runner
from alma.errors import ToolError, ToolNotFound, ToolTimeout
from alma.imagebuild.project import RepoPin

GIB = 1 << 30
GB = 10**9

# oe-core scarthgap meta/conf/bitbake.conf HOSTTOOLS (the fatal list) plus sanity.bbclass's
# SANITY_REQUIRED_UTILITIES, mapped to the Debian 12 package that ships each tool. The
# package set is the Yocto 5.0 (scarthgap) "required packages for the build host" list.
_TOOLS_BY_PACKAGE: dict[str, str] = {
    "coreutils": "[ basename cat chgrp chmod chown comm cp cut date dd dirname du echo env expand expr false head id "
    "install ln ls md5sum mkdir mkfifo mknod mktemp mv od pr printf pwd readlink realpath rm rmdir seq "
    "sha1sum sha224sum sha256sum sha384sum sha512sum sleep sort split stat tail tee test touch tr true "
    "truncate uname uniq wc",
    "binutils": "ar as ld nm objcopy objdump ranlib readelf strings strip",
    "build-essential": "cpp gcc g++ make rpcgen",  # rpcgen: rpcsvc-proto, pulled in by libc6-dev
    "gawk": "awk gawk",
    "bash": "bash",
    "bzip2": "bunzip2 bzip2",
    "chrpath": "chrpath",
    "diffutils": "cmp diff",
    "cpio": "cpio",
    "diffstat": "diffstat",
    "grep": "egrep fgrep grep",
    "file": "file",
    "findutils": "find xargs",
    "util-linux": "flock getopt",
    "libc-bin": "getconf iconv ldd",
    "git": "git",
    "gzip": "gunzip gzip",
    "hostname": "hostname",
    "lz4": "lz4c",
    "patch": "patch",
    "perl": "perl",
    "python3": "python3",
    "zstd": "pzstd unzstd zstd",
    "sed": "sed",
    "dash": "sh",
    "tar": "tar",
    "wget": "wget",
    "debianutils": "which",
}
HOSTTOOLS_DEBIAN: dict[str, str] = {t: pkg for pkg, tools in _TOOLS_BY_PACKAGE.items() for t in tools.split()}

# A full image for these Orin machines (meta-tegra R36, no rm_work): tmp/ ~110 GB,
# downloads ~15 GB, sstate-cache ~25 GB. All three share the tegra234 SoC and the same BSP.
DISK_NEED_GB: dict[str, int] = {
    "jetson-orin-nano-devkit": 150,
    "jetson-orin-nano-devkit-nvme": 150,
    "jetson-agx-orin-devkit": 150,
}
DEFAULT_DISK_NEED_GB = 150
CHECK_DISK_NEED_GB = 10  # --check: repositories + parse cache only
RAM_PER_TASK_GIB = 2
LS_REMOTE_TIMEOUT_S = 15.0


def _existing_parent(path: Path) -> Path:
    for cand in (path, *path.parents):
        if cand.exists():
            return cand
    return Path("/")


def _disk_free(path: Path) -> int:
    return shutil.disk_usage(_existing_parent(path)).free


def _mem_total(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _locales() -> set[str] | None:
    try:
        res = runner.capture(["locale", "-a"], timeout=10, check=False)
    except ToolError:
        return None
    return {ln.strip().lower().replace("-", "") for ln in res.lines}


def _ls_remote(url: str, timeout: float) -> str | None:
    """None if ``url`` answers ``git ls-remote``; else git's own last words."""
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_ASKPASS="/bin/false", SSH_ASKPASS="/bin/false")
    try:
        res = runner.capture(["git", "ls-remote", "--quiet", url, "HEAD"], env=env, timeout=timeout, check=False)
    except ToolTimeout:
        return f"no answer within {timeout:.0f} s"
    except ToolNotFound:
        return "git is not installed"
    if res.returncode == 0:
        return None
    said = [ln.strip() for ln in res.lines if ln.strip()]
    return said[-1] if said else f"git ls-remote exited with code {res.returncode}"


def _find_kas() -> str | None:
    from alma.settings import tool

    name = tool("kas")
    if os.sep in name:
        return name if os.access(name, os.X_OK) else None
    found = shutil.which(name)
    if found:
        return found
    # alma runs from a venv that is not on PATH: kas is a dependency, installed beside it.
    beside = Path(sys.executable).parent / name
    return str(beside) if os.access(beside, os.X_OK) else None


@dataclass
class Probes:
    """The machine as preflight sees it. Tests pass their own functions."""

    euid: Callable[[], int] = os.geteuid
    which: Callable[[str], str | None] = shutil.which
    find_kas: Callable[[], str | None] = _find_kas
    disk_free: Callable[[Path], int] = _disk_free
    mem_total: Callable[[], int | None] = _mem_total
    cpu_count: Callable[[], int] = lambda: os.cpu_count() or 1
    locales: Callable[[], set[str] | None] = _locales
    ls_remote: Callable[[str, float], str | None] = _ls_remote
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))


def auto_jobs(probes: Probes) -> int:
    """bitbake's default parallelism (one task per CPU), capped so each task has RAM_PER_TASK_GIB."""
    cpus = max(1, probes.cpu_count())
    mem = probes.mem_total()
    if mem is None:
        return cpus
    return max(1, min(cpus, mem // (RAM_PER_TASK_GIB * GIB)))


Problem = tuple[str, str]


def check_user(probes: Probes) -> list[Problem]:
    if probes.euid() != 0:
        return []
    user = probes.env.get("SUDO_USER")
    how = (
        f"sudo -u {user} -H {' '.join(_argv_for_hint())}"
        if user and user != "root"
        else "sudo useradd -m builder && sudo -u builder -H " + " ".join(_argv_for_hint())
    )
    return [("running as root: bitbake refuses root ('Do not use Bitbake as root.')", how)]


def _argv_for_hint() -> list[str]:
    argv = [a for a in sys.argv if a and a != "--dry-run"]
    return argv if argv and argv[0].endswith("alma") else ["alma", "build"]


def check_tools(probes: Probes) -> list[Problem]:
    missing = [t for t in HOSTTOOLS_DEBIAN if probes.which(t) is None]
    problems: list[Problem] = []
    if missing:
        pkgs = sorted({HOSTTOOLS_DEBIAN[t] for t in missing})
        problems.append(
            (
                f"host tools bitbake needs are missing: {' '.join(missing)}",
                "sudo apt-get install " + " ".join(pkgs),
            )
        )
    if probes.find_kas() is None:
        problems.append(("kas is not installed", ".venv/bin/pip install -e .  (kas is a dependency of alma)"))
    return problems


def check_locale(probes: Probes) -> list[Problem]:
    have = probes.locales()
    if have is None or "en_us.utf8" in have:
        return []
    return [
        (
            "locale en_US.UTF-8 is not generated (kas and bitbake run with LC_ALL=en_US.UTF-8)",
            "sudo apt-get install locales && sudo sed -i 's/^# *en_US.UTF-8/en_US.UTF-8/' /etc/locale.gen"
            " && sudo locale-gen",
        )
    ]


def check_disk(probes: Probes, build_dir: Path, need_gb: int) -> list[Problem]:
    free = probes.disk_free(build_dir)
    if free >= need_gb * GB:
        return []
    return [
        (
            f"free disk at {_existing_parent(build_dir)}: {free / GB:.1f} GB, this build needs ~{need_gb} GB",
            f"free {need_gb - free / GB:.0f} GB there, or build elsewhere: alma build --build-dir /big/disk/alma",
        )
    ]


def check_ram(probes: Probes, jobs: int) -> list[Problem]:
    mem = probes.mem_total()
    if mem is None:
        return []
    fits = mem // (RAM_PER_TASK_GIB * GIB)
    if fits < 1:
        return [
            (
                f"RAM {mem / GIB:.1f} GiB is under the {RAM_PER_TASK_GIB} GiB one bitbake task needs",
                "build on a host with at least 8 GiB of RAM",
            )
        ]
    if jobs > fits:
        return [
            (
                f"--jobs {jobs} needs ~{jobs * RAM_PER_TASK_GIB} GiB RAM ({RAM_PER_TASK_GIB} GiB per bitbake task), "
                f"this host has {mem / GIB:.1f} GiB",
                f"alma build --jobs {fits}",
            )
        ]
    return []


def check_network(probes: Probes, repos: list[RepoPin], timeout: float = LS_REMOTE_TIMEOUT_S) -> list[Problem]:
    todo = [r for r in repos if r.url and not r.checked_out]
    if not todo:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(todo))) as pool:
        answers = list(pool.map(lambda r: probes.ls_remote(str(r.url), timeout), todo))
    problems: list[Problem] = []
    for repo, err in zip(todo, answers, strict=True):
        if err is None:
            continue
        problems.append(
            (
                f"repository {repo.repo_id} ({repo.url}) is not checked out and cannot be reached: {err}",
                f"allow git access to {repo.url} (proxy: export https_proxy=...), or clone it yourself: "
                f"git clone{' -b ' + repo.branch if repo.branch else ''} {repo.url} {repo.checkout_dir}",
            )
        )
    return problems


def default_probes() -> Probes:
    """The real machine. One seam for tests (monkeypatch this function)."""
    return Probes()
