"""From the user's request to the exact kas command, environment and generated config.

The build tree (repositories, downloads, sstate, each machine's TMPDIR and deploy dir) is
defined once in :mod:`alma.buildtree`; a run adds two things to its machine's directory:

    build/<machine>/alma-build.conf        generated here, read by bitbake after local.conf (-R)
    build/<machine>/alma-build-<stamp>.log the full output of each run; alma-build-latest.log -> newest

The command-line choices (--jobs, --sstate-mirror, --hashserv) go into ``alma-build.conf``,
passed with ``bitbake -R`` (postread: parsed after bitbake.conf and local.conf), so they win
over the kas files for this run only and are visible in one file. DL_DIR and SSTATE_DIR go
through the environment, which kas forwards to bitbake as weak defaults: a kas file that
sets them still wins.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alma.buildtree import BuildTree, build_tree
from alma.errors import ConfigError, UserError
from alma.imagebuild.preflight import Probes
from alma.imagebuild.project import DEFAULT_IMAGE, DEFAULT_MACHINE, FULL_SHA, KasConfig, Project, load_kas

CONF_NAME = "alma-build.conf"
_BB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+:-]*$")  # a recipe (mc:... too) or a task (do_ optional)

_HASHSERV = re.compile(r"^(unix://\S+|wss?://\S+|[A-Za-z0-9_.-]+:\d{1,5}|\[[0-9A-Fa-f:]+\]:\d{1,5})$")


@dataclass
class BuildRequest:
    machine: str = DEFAULT_MACHINE
    image: str = DEFAULT_IMAGE
    features: tuple[str, ...] = ()
    check: bool = False
    sstate_mirror: str | None = None
    hashserv: str | None = None
    jobs: int | None = None
    build_dir: Path | None = None
    # issue 14: admin access (alma.imagebuild.access)
    admin_keys: tuple[Path, ...] = ()
    no_admin_access: bool = False
    ota_cert: Path | None = None  # issue 23: feature ota's signing certificate (alma.imagebuild.ota)
    # issue 22: kas parity
    target: str | None = None  # a recipe other than the image (bitbake's target)
    task: str | None = None  # bitbake -c TASK
    keep_going: bool = False  # bitbake -k
    bitbake_args: tuple[str, ...] = ()  # after `--`: passed to bitbake verbatim (quoted)
    kas_files: tuple[str, ...] = ()  # --kas-file a.yml[:b.yml]: more kas files, after the features
    shell: str | None = None  # alma shell: the command for kas shell -c ("" = interactive)


@dataclass
class BuildPlan:
    request: BuildRequest
    root: Path
    kas_files: list[Path]
    kas: KasConfig
    tree: BuildTree
    machine_dir: Path
    conf_path: Path
    conf_text: str
    env: dict[str, str]  # added to the caller's environment
    argv: list[str]
    jobs: int | None
    jobs_auto: bool = False
    notes: list[str] = field(default_factory=list)
    make_jobs: int | None = None
    # what the plan itself found wrong (offline): listed first among the preflight problems
    problems: list[tuple[str, str]] = field(default_factory=list)

    @property
    def work_dir(self) -> Path:
        return self.tree.work_dir

    @property
    def mode(self) -> str:
        if self.request.shell is not None:
            return "shell"
        return "check" if self.request.check else "build"

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "machine": self.request.machine,
            "image": self.request.image,
            "features": list(self.request.features),
            "kas_files": [str(p) for p in self.kas_files],
            "cwd": str(self.root),
            "env": self.env,
            "argv": self.argv,
            "config_path": str(self.conf_path),
            "config": self.conf_text,
            "jobs": self.jobs,
            "parallel_make": self.make_jobs,
            "notes": self.notes,
            "env_sources": {k: self.env_source(k) for k in self.env},
            "problems": [{"problem": w, "fix": f} for w, f in self.problems],
        }

    def env_source(self, name: str) -> str:
        """Where the value of ``name`` in :attr:`env` came from: environment, --build-dir or default."""
        return self.tree.source(name)


def sstate_mirrors_value(url: str) -> str:
    """SSTATE_MIRRORS for one mirror: a URL (http/https/file) or an absolute directory."""
    if url.startswith("/"):
        url = "file://" + url
    if not re.match(r"^(https?|file)://\S+$", url):
        raise UserError(
            f"--sstate-mirror {url!r}: expected an http(s):// or file:// URL or an absolute directory",
            hint="alma build --sstate-mirror https://cache.example.org/sstate  (or /srv/sstate-cache)",
        )
    return f"file://.* {url.rstrip('/')}/PATH;downloadfilename=PATH"


def check_hashserv(addr: str) -> str:
    if not _HASHSERV.match(addr):
        raise UserError(
            f"--hashserv {addr!r}: expected host:port, unix:///path/to.sock or ws(s)://host:port",
            hint="alma build --hashserv hashserv.lab:8686",
        )
    return addr


def render_conf(req: BuildRequest, jobs: int | None, make_jobs: int | None = None) -> str:
    lines = [
        "# Generated by `alma build` for this run; read by bitbake after local.conf (bitbake -R).",
        "# Edit the kas files or the alma build options instead of this file.",
    ]
    if jobs is not None:
        make = make_jobs or jobs
        lines += [
            f"# --jobs (or one per CPU, capped by RAM); every task may run make -j {make} at once, so at",
            f"# most {jobs} x {make} = {jobs * make} compilers, each with 2 GiB of this host's RAM",
            f'BB_NUMBER_THREADS = "{jobs}"',
            f'PARALLEL_MAKE = "-j {make}"',
        ]
    if req.check:
        lines += [
            "# --check: parse and compute the graph offline; nothing is fetched (sanity.bbclass's",
            "# connectivity check and every fetcher honour it), so a host with cached repos suffices",
            'BB_NO_NETWORK = "1"',
        ]
    if req.sstate_mirror:
        lines += [
            "# --sstate-mirror: a shared cache of build results",
            f'SSTATE_MIRRORS = "{sstate_mirrors_value(req.sstate_mirror)}"',
        ]
    if req.hashserv:
        lines += [
            "# --hashserv: a local hash-equivalence server (auto) that asks the shared, read-only one upstream",
            'BB_SIGNATURE_HANDLER = "OEEquivHash"',
            'BB_HASHSERVE = "auto"',
            f'BB_HASHSERVE_UPSTREAM = "{check_hashserv(req.hashserv)}"',
        ]
    return "\n".join(lines) + "\n"


def _with_admin_access(
    req: BuildRequest, project: Project, kas: KasConfig, conf_text: str
) -> tuple[str, str, tuple[str, str] | None]:
    from alma.imagebuild import access
    from alma.settings import config

    acc = access.resolve(
        release=access.is_release(kas.data.get("local_conf_header")),
        cli_keys=req.admin_keys,
        no_admin_access=req.no_admin_access,
        root=project.root,
        config=config(project.root),
    )
    lines = acc.conf_lines()
    return conf_text + ("\n".join(lines) + "\n" if lines else ""), acc.note(), acc.problem


def _with_ota(
    req: BuildRequest, project: Project, kas: KasConfig, machine_dir: Path
) -> tuple[str, tuple[str, str] | None, list[str]]:
    """(conf lines, problem): a release without the OTA certificate is one of the plan's
    problems (like the admin key); any other wrong OTA setting stops at once (ConfigError)."""
    from alma.ground import write_atomic
    from alma.imagebuild import access, ota
    from alma.settings import config

    try:
        settings = ota.resolve(features=req.features, release=access.is_release(kas.data.get("local_conf_header")),
                               cli_cert=req.ota_cert, root=project.root, config=config(project.root))  # fmt: skip
    except ota.MissingOtaCert as exc:
        return "", (exc.message, exc.hint or "see docs/ota.md"), []
    if settings is None:
        return "", None, []
    cfg = None
    if settings.hawkbit_url:
        cfg = machine_dir / ota.CFG_NAME
        machine_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(cfg, ota.suricatta_config(settings))
    return "\n".join(settings.conf_lines(cfg)) + "\n", None, settings.notes


def choose_jobs(req: BuildRequest, probes: Probes | None) -> tuple[int | None, int | None, list[str]]:
    """(BB_NUMBER_THREADS, PARALLEL_MAKE -j, notes) for this host.

    bitbake's defaults are one task per CPU and make -j <CPUs> inside each, CPUs² compilers:
    both are set so that their product fits the RAM (2 GiB per compiler).
    """
    if probes is None or (req.check and req.jobs is None):
        return req.jobs, None, []
    from alma.imagebuild import preflight as pf

    jobs = req.jobs if req.jobs is not None else pf.auto_jobs(probes)
    make = pf.parallel_make(probes, jobs)
    slots = pf.ram_slots(probes)
    ram = f"{slots * pf.RAM_PER_TASK_GIB} GiB of RAM" if slots is not None else "RAM unknown"
    source = "--jobs" if req.jobs is not None else f"one per CPU ({probes.cpu_count()}), capped by RAM"
    notes = [
        f"jobs: {jobs} parallel bitbake tasks ({source}; set with --jobs), make -j {make} in each: "
        f"at most {jobs * make} compilers at {pf.RAM_PER_TASK_GIB} GiB each ({ram})"
    ]
    return jobs, make, notes


def make_plan(req: BuildRequest, project: Project, probes: Probes | None = None) -> BuildPlan:
    """Validate everything offline and compute the exact command. Raises UserError/ConfigError.

    ``probes`` (the host) sizes the parallelism; without it bitbake's defaults stand."""
    project.require_layout()
    files = project.kas_files(req.machine, req.features) + project.extra_kas_files(req.kas_files)
    project.check_image(req.image)
    for name, value in (("--target", req.target), ("--task", req.task)):
        if value is not None and not _BB_NAME.match(value):
            raise UserError(f"{name} {value!r}: not a recipe or task name", hint=f"alma build {name} busybox")
    if req.jobs is not None and req.jobs < 1:
        raise UserError(f"--jobs {req.jobs}: must be at least 1", hint="alma build --jobs 4")
    kas = load_kas(project, files)
    unpinned = [r for r in kas.repos(project.root) if r.url and not (r.commit and FULL_SHA.match(r.commit))]
    if unpinned:
        what = ", ".join(
            f"{r.repo_id} ({'commit: ' + r.commit if r.commit else 'branch: ' + str(r.branch)})" for r in unpinned
        )
        raise ConfigError(
            f"repositories not pinned to a full 40-hex commit: {what}; a build must be reproducible",
            hint="pin them: set commit: <40-hex sha> in the kas file, or run kas lock (then alma lint)",
        )
    tree = build_tree(project.root, req.build_dir, probes.env if probes is not None else os.environ)
    machine_dir = tree.machine_dir(req.machine)
    conf_path = machine_dir / CONF_NAME
    jobs, make_jobs, notes = choose_jobs(req, probes)
    jobs_auto = req.jobs is None and jobs is not None
    conf_text = render_conf(req, jobs, make_jobs)
    # issue 14: admin keys for the image, decided offline (a release without one is a problem)
    conf_text, access_note, access_problem = _with_admin_access(req, project, kas, conf_text)
    notes.append(access_note)
    ota_text, ota_problem, ota_notes = _with_ota(req, project, kas, machine_dir)  # issue 23: a cert for a release
    notes += ota_notes
    conf_text += ota_text
    bb = f"bitbake -R {shlex.quote(str(conf_path))}"
    image = shlex.quote(req.image)
    if req.check:
        command = f"{bb} -p && {bb} -g {image}"
    else:
        opts = (["-k"] if req.keep_going else []) + (["-c", shlex.quote(req.task)] if req.task else [])
        extra = [shlex.quote(a) for a in req.bitbake_args]
        command = " ".join([bb, *opts, shlex.quote(req.target) if req.target else image, *extra])
    rel = [str(f.relative_to(project.root)) for f in files]
    from alma.imagebuild.preflight import _find_kas  # the path kas will really run from

    if req.shell is not None:  # kas shell: bitbake in it reads the plan's config via conf/auto.conf
        argv = [_find_kas() or "kas", "shell", ":".join(rel), *(["-c", req.shell] if req.shell else [])]
    else:
        argv = [_find_kas() or "kas", "shell", ":".join(rel), "-c", command]
    env = {**tree.env(), "KAS_BUILD_DIR": str(machine_dir)}
    return BuildPlan(
        request=req,
        root=project.root,
        kas_files=files,
        kas=kas,
        tree=tree,
        machine_dir=machine_dir,
        conf_path=conf_path,
        conf_text=conf_text,
        env=env,
        argv=argv,
        jobs=jobs,
        jobs_auto=jobs_auto,
        notes=notes,
        make_jobs=make_jobs,
        problems=[p for p in (project.vcs_problem(), access_problem, ota_problem) if p is not None],
    )
