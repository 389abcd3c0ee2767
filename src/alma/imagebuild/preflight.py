"""Checks before anything slow: host tools, kas, disk, RAM, user, build tree, locale, network.

Every check is one function ``check_x(plan, probes) -> list[Problem]`` listed in
:data:`CHECKS` (offline ones) or :data:`NETWORK_CHECKS`; a problem is ``(what is wrong,
the command that fixes it)`` and all checks run, so the user sees every problem at once.
Adding a check is adding one function to a list. The machine is reached only through
``Probes``, whose fields tests replace.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from alma import runner
from alma.errors import ToolError, ToolNotFound, ToolTimeout
from alma.imagebuild.project import RepoPin

if TYPE_CHECKING:
    from alma.imagebuild.plan import BuildPlan

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

# A full image for these Orin machines (meta-tegra R36): without rm_work tmp/ keeps every
# recipe's work dir, ~110 GB, plus downloads ~15 GB and sstate-cache ~25 GB. With rm_work
# (kas/alma.yml inherits it) a recipe's work dir is removed once its outputs are in sstate:
# tmp/ holds deploy, sysroots and the largest work dirs in flight, ~50 GB. All three
# machines share the tegra234 SoC and the same BSP; alma.toml [build] disk_gb overrides.
DISK_NEED_GB: dict[str, int] = {
    "jetson-orin-nano-devkit": 150,
    "jetson-orin-nano-devkit-nvme": 150,
    "jetson-agx-orin-devkit": 150,
}
DEFAULT_DISK_NEED_GB = 150
RM_WORK_SAVES_GB = 60
CHECK_DISK_NEED_GB = 10  # --check: repositories + parse cache only
OUTSIDE_TMP_GB = 40  # of a full image's figure: downloads ~15 GB + sstate ~25 GB, in the build tree
RAM_PER_TASK_GIB = 2  # one compiler process of a big C++ unit; bounds BB_NUMBER_THREADS x PARALLEL_MAKE
_RM_WORK = re.compile(r"""^\s*INHERIT\s*(?:\+=|\.=|=|\?=|\?\?=|:append\s*=)\s*["'][^"']*\brm_work\b""", re.M)
LS_REMOTE_TIMEOUT_S = 15.0


def _existing_parent(path: Path) -> Path:
    for cand in (path, *path.parents):
        if cand.exists():
            return cand
    return Path("/")


def _disk_free(path: Path) -> int:
    return shutil.disk_usage(_existing_parent(path)).free


def _device(path: Path) -> int:
    return os.stat(_existing_parent(path)).st_dev


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


def _ls_remote(url: str, timeout: float, env: Mapping[str, str] | None = None) -> str | None:
    """None if ``url`` answers ``git ls-remote`` (run in ``env``, default ours); else git's own last words."""
    env = dict(os.environ if env is None else env, GIT_TERMINAL_PROMPT="0", GIT_ASKPASS="/bin/false",
               SSH_ASKPASS="/bin/false")  # fmt: skip
    try:
        res = runner.capture(["git", "ls-remote", "--quiet", url, "HEAD"], env=env, timeout=timeout, check=False)
    except ToolTimeout:
        return f"no answer within {timeout:.0f} s"
    except ToolNotFound:
        return "git is not installed"
    if res.returncode == 0:
        return None
    said = [ln.strip() for ln in res.lines if ln.strip()]
    # the first "fatal:" names the cause; the last line is git's generic "...the repository exists."
    fatal = [ln for ln in said if ln.startswith(("fatal:", "error:"))]
    return (fatal or said or [f"git ls-remote exited with code {res.returncode}"])[0]


def _owner(path: Path) -> int | None:
    try:
        return path.stat().st_uid
    except OSError:
        return None


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


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
    device: Callable[[Path], int] = _device  # the filesystem a path is (or would be) on
    mem_total: Callable[[], int | None] = _mem_total
    cpu_count: Callable[[], int] = lambda: os.cpu_count() or 1
    locales: Callable[[], set[str] | None] = _locales
    ls_remote: Callable[[str, float, Mapping[str, str]], str | None] = _ls_remote
    access: Callable[[Path, int], bool] = os.access
    owner: Callable[[Path], int | None] = _owner
    user_name: Callable[[int], str] = _user_name
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))


def ram_slots(probes: Probes) -> int | None:
    """How many compilers the RAM holds at RAM_PER_TASK_GIB each (None: unknown)."""
    mem = probes.mem_total()
    return None if mem is None else mem // (RAM_PER_TASK_GIB * GIB)


def auto_jobs(probes: Probes) -> int:
    """bitbake's default parallelism (one task per CPU), capped so each task has RAM_PER_TASK_GIB."""
    cpus = max(1, probes.cpu_count())
    slots = ram_slots(probes)
    return cpus if slots is None else max(1, min(cpus, slots))


def parallel_make(probes: Probes, jobs: int) -> int:
    """PARALLEL_MAKE's -j for ``jobs`` bitbake tasks: every task may run make at once, so
    jobs x make must fit the RAM (and make never exceeds the CPUs)."""
    cpus = max(1, probes.cpu_count())
    slots = ram_slots(probes)
    per_task = cpus if slots is None else slots // max(1, jobs)
    return max(1, min(cpus, per_task))


def suggest_jobs(probes: Probes) -> int:
    """A --jobs this host can run: no more tasks than CPUs, and RAM for each."""
    return auto_jobs(probes)


Problem = tuple[str, str]


def check_user(plan: BuildPlan | None, probes: Probes) -> list[Problem]:
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


def check_tools(plan: BuildPlan | None, probes: Probes) -> list[Problem]:
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


def check_locale(plan: BuildPlan | None, probes: Probes) -> list[Problem]:
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


def uses_rm_work(plan: BuildPlan) -> bool:
    """Whether the merged kas config inherits rm_work (kas/alma.yml's local_conf_header does)."""
    blocks = plan.kas.data.get("local_conf_header") or {}
    return isinstance(blocks, dict) and any(isinstance(b, str) and _RM_WORK.search(b) for b in blocks.values())


@dataclass(frozen=True)
class DiskNeed:
    gb: int
    why: str  # how the figure was arrived at, shown with it


def disk_need(plan: BuildPlan) -> DiskNeed:
    """Free disk a run needs: alma.toml [build] disk_gb, else the machine's figure (less with rm_work)."""
    from alma.settings import config

    build_cfg = config(plan.root).get("build", {})
    if isinstance(build_cfg, dict) and isinstance(build_cfg.get("disk_gb"), int):
        return DiskNeed(int(build_cfg["disk_gb"]), "alma.toml [build] disk_gb")
    if plan.request.check:
        return DiskNeed(CHECK_DISK_NEED_GB, "--check: repositories and the parse cache")
    if plan.request.shell is not None:  # what is built in the shell is the user's call; alma build checks it
        return DiskNeed(CHECK_DISK_NEED_GB, "a shell: repositories and the parse cache")
    full = DISK_NEED_GB.get(plan.request.machine, DEFAULT_DISK_NEED_GB)
    if uses_rm_work(plan):
        return DiskNeed(full - RM_WORK_SAVES_GB, "a full image with rm_work (inherited by the kas files)")
    return DiskNeed(full, "a full image without rm_work")


def _disk_problem(where: Path, free: int, gb: int, who: str, why: str, fix: str) -> Problem:
    return (f"free disk at {_existing_parent(where)}: {free / GB:.1f} GB, {who} needs ~{gb} GB ({why})",
            f"free {gb - free / GB:.0f} GB there, or {fix}; if you know this build needs less, set it in "
            "alma.toml: [build] disk_gb = N")  # fmt: skip


def check_disk(plan: BuildPlan, probes: Probes) -> list[Problem]:
    """The free disk a run needs, where it will be written: bitbake's TMPDIR (the bulk) and the
    build tree (downloads, sstate), each on its own filesystem when TMPDIR is elsewhere."""
    need = disk_need(plan)
    build_dir = plan.work_dir
    elsewhere = _tmpdir_fix(plan)
    tmp = plan.tree.bitbake_tmpdir(plan.request.machine)
    if elsewhere is None or probes.device(tmp) == probes.device(build_dir):
        parts = [(build_dir, need.gb, "this build", need.why, "build elsewhere: alma build --build-dir /big/disk/alma")]
    else:
        rest = min(need.gb, OUTSIDE_TMP_GB)
        tmp_gb = need.gb - rest or need.gb  # a small figure (--check) is not split: each side needs it
        parts = [
            (tmp, tmp_gb, f"bitbake's TMPDIR {tmp}", f"{need.why}, less downloads and sstate", elsewhere),
            (build_dir, rest, "the build tree", "downloads and sstate", "build elsewhere: alma build --build-dir DIR"),
        ]
    found = []
    for where, gb, who, why, fix in parts:
        free = probes.disk_free(where)
        if free < gb * GB:
            found.append(_disk_problem(where, free, gb, who, why, fix))
    return found


def check_ram(plan: BuildPlan, probes: Probes) -> list[Problem]:
    if plan.request.check or plan.request.shell is not None:
        return []  # parsing runs one bitbake server, no compilers
    mem = probes.mem_total()
    slots = ram_slots(probes)
    if mem is None or slots is None:
        return []
    if slots < 1:
        return [
            (
                f"RAM {mem / GIB:.1f} GiB is under the {RAM_PER_TASK_GIB} GiB one bitbake task needs",
                "build on a host with at least 8 GiB of RAM",
            )
        ]
    jobs = plan.request.jobs or 1
    if jobs > slots:
        return [
            (
                f"--jobs {jobs} needs ~{jobs * RAM_PER_TASK_GIB} GiB RAM ({RAM_PER_TASK_GIB} GiB per bitbake task), "
                f"this host has {mem / GIB:.1f} GiB",
                f"alma build --jobs {suggest_jobs(probes)}",
            )
        ]
    return []


def check_cpus(plan: BuildPlan, probes: Probes) -> list[Problem]:
    jobs, cpus = plan.request.jobs, max(1, probes.cpu_count())
    if plan.request.check or jobs is None or jobs <= cpus:
        return []
    return [
        (
            f"--jobs {jobs} on {cpus} CPU{'s' if cpus != 1 else ''}: tasks would only wait for each other",
            f"alma build --jobs {suggest_jobs(probes)}",
        )
    ]


def check_build_tree(plan: BuildPlan, probes: Probes) -> list[Problem]:
    """The build user must be able to write every directory of the tree that exists, and the
    nearest existing parent of those that do not (a root build leaves root-owned dirs)."""
    uid = probes.euid()
    user = probes.user_name(uid)
    tree = plan.tree
    dirs = [tree.work_dir, tree.downloads, tree.sstate, plan.machine_dir, plan.machine_dir / "conf"]
    problems: list[Problem] = []
    seen: set[Path] = set()
    for d in dirs:
        target = _existing_parent(d)
        if target in seen:
            continue
        seen.add(target)
        owner = probes.owner(target)
        if not probes.access(target, os.W_OK | os.X_OK):
            who = f" (owned by {probes.user_name(owner)})" if owner is not None and owner != uid else ""
            fix = (
                f"sudo chown -R {user}: {target}"
                if target == d or target.is_relative_to(tree.work_dir)
                else f"alma build --build-dir /a/dir/{user}/can/write"
            )
            problems.append((f"{target} is not writable by {user}{who}: the build would stop there", fix))
        elif target == d and owner is not None and owner != uid and uid != 0:
            problems.append(
                (
                    f"{target} is owned by {probes.user_name(owner)}, not {user}: files another user's build left "
                    "there cannot be replaced",
                    f"sudo chown -R {user}: {target}",
                )
            )
    return problems


def check_network(plan: BuildPlan, probes: Probes) -> list[Problem]:
    return unreachable_repos(probes, plan.kas.repos(plan.work_dir))


def premirror_url(url: str, premirrors: str) -> str:
    """The URL kas clones from: the first ``KAS_PREMIRRORS`` line (``regex replacement``)
    whose regex matches ``url`` (kas 5.5 repos.py ``Repo.effective_url``), else ``url``."""
    for line in premirrors.split("\n"):
        parts = line.split()
        if len(parts) != 2:
            continue
        try:
            if re.match(parts[0], url):
                return re.sub(parts[0], parts[1], url)
        except re.error:
            continue
    return url


def kas_git_env(env: Mapping[str, str], home: Path) -> dict[str, str]:
    """The environment kas gives git: a HOME of its own whose only .gitconfig is a copy of
    ``GITCONFIG_FILE`` (kas 5.5 libcmds.py ``SetupHome._setup_gitconfig``), so the user's
    ~/.gitconfig (``insteadOf`` rules, proxies) does not reach kas's git unless exported so."""
    out = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env, "HOME": str(home)}
    for name in ("XDG_CONFIG_HOME", "GIT_CONFIG_GLOBAL"):
        out.pop(name, None)
    gitconfig = env.get("GITCONFIG_FILE")
    if gitconfig and Path(gitconfig).is_file():
        shutil.copyfile(gitconfig, home / ".gitconfig")
    return out


def unreachable_repos(
    probes: Probes, repos: list[RepoPin], timeout: float = LS_REMOTE_TIMEOUT_S, every: bool = False
) -> list[Problem]:
    """Every repository kas would clone (``every``: fetch, as --update does), asked as kas's git
    will ask: through KAS_PREMIRRORS, with kas's HOME and gitconfig."""
    import tempfile

    todo = [r for r in repos if r.url and (every or not r.checked_out)]
    if not todo:
        return []
    mirrors = probes.env.get("KAS_PREMIRRORS", "")
    urls = [premirror_url(str(r.url), mirrors) for r in todo]
    with tempfile.TemporaryDirectory(prefix="alma-kas-home-") as home:
        genv = kas_git_env(probes.env, Path(home))
        with ThreadPoolExecutor(max_workers=min(8, len(todo))) as pool:
            answers = list(pool.map(lambda u: probes.ls_remote(u, timeout, genv), urls))
    user_cfg = Path(probes.env.get("HOME", "~")).expanduser() / ".gitconfig"
    try:
        rewrites = "insteadof" in user_cfg.read_text(encoding="utf-8", errors="replace").lower()
    except OSError:
        rewrites = False
    problems: list[Problem] = []
    for repo, url, err in zip(todo, urls, answers, strict=True):
        if err is None:
            continue
        via = f" (premirror {url})" if url != repo.url else ""
        if "dubious ownership" in err:  # a mirror owned by another user: kas's git has no safe.directory
            path = url.removeprefix("file://")
            fix = (
                f"kas runs git with a HOME of its own: add '[safe]' 'directory = {path}' to a gitconfig and "
                f"export GITCONFIG_FILE=<that file> (kas copies it into its HOME), or own the mirror as this user"
            )
        elif rewrites and not probes.env.get("GITCONFIG_FILE"):
            fix = (
                f"kas runs git with a HOME of its own and does not read {user_cfg} (its url.insteadOf rules "
                f"among it): export GITCONFIG_FILE={user_cfg}"
            )
        else:
            fix = (
                f"allow git access to {url} (proxy: export https_proxy=...), or point kas at a mirror: "
                f"export KAS_PREMIRRORS='{re.escape(str(repo.url))} file:///path/to/mirror.git'"
            )
        state = "" if repo.checked_out else " is not checked out and"
        problems.append((f"repository {repo.repo_id} ({repo.url}){via}{state} cannot be "
                         f"reached by kas's git: {err}", fix))  # fmt: skip
    return problems


def _tmpdir_fix(plan: BuildPlan) -> str | None:
    """How to move bitbake's TMPDIR when it is outside the build tree (None: it is inside)."""
    if plan.tree.tmp_dir is None:
        return None
    if plan.tree.source("TMPDIR") == "environment":
        return "keep the build output in the build tree: env -u TMPDIR alma build …"
    return "set TMPDIR in the kas file's local_conf_header to a directory on a disk with room"


def check_tmpdir(plan: BuildPlan, probes: Probes) -> list[Problem]:
    """bitbake's TMPDIR outside the build tree (an exported TMPDIR, which kas passes to bitbake,
    or the kas files'): bitbake creates ``<TMPDIR>-glibc``, so its parent must be writable by
    the build user. A login's TMPDIR from libpam-tmpdir (/tmp/user/<uid>) is not: /tmp/user
    is root's."""
    fix = _tmpdir_fix(plan)
    if fix is None:
        return []
    tmp = plan.tree.bitbake_tmpdir(plan.request.machine)
    target = _existing_parent(tmp)
    if probes.access(target, os.W_OK | os.X_OK):
        return []
    uid = probes.euid()
    return [
        (
            f"bitbake's TMPDIR would be {tmp} ({plan.tree.source('TMPDIR')} TMPDIR {plan.tree.tmp_dir}, plus "
            f"oe-core's -glibc), but {target} is not writable by {probes.user_name(uid)}: bitbake would stop there",
            fix,
        )
    ]


Check = Callable[["BuildPlan", Probes], list[Problem]]
# Offline checks (also shown by --dry-run), then the ones that reach the network.
CHECKS: list[Check] = [
    check_user,
    check_tools,
    check_locale,
    check_tmpdir,
    check_build_tree,
    check_disk,
    check_cpus,
    check_ram,
]
NETWORK_CHECKS: list[Check] = [check_network]


def problems(plan: BuildPlan, probes: Probes, network: bool = True) -> list[Problem]:
    """The plan's own problems (a release without an admin key), then every host check's."""
    found = list(plan.problems)
    return found + [p for check in (*CHECKS, *(NETWORK_CHECKS if network else ())) for p in check(plan, probes)]


def default_probes() -> Probes:
    """The real machine. One seam for tests (monkeypatch this function)."""
    return Probes()
