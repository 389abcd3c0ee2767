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
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from alma.buildtree import BuildTree, build_tree
from alma.errors import ConfigError, UserError
from alma.imagebuild.kasview import KasView, resolve
from alma.imagebuild.preflight import Probes
from alma.imagebuild.project import DEFAULT_IMAGE, DEFAULT_MACHINE, FULL_SHA, KasConfig, Project, load_kas

CONF_NAME = "alma-build.conf"
_RECIPE = re.compile(r"^(virtual/)?[A-Za-z0-9][A-Za-z0-9_.+:-]*$")  # a recipe, virtual/kernel, mc:x:recipe
_TASK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_]*$")  # compile, do_compile, populate_sdk_ext
_SETS_VAR = r"^[ \t]*(export[ \t]+)?{}[ \t]*(=|:=|\?=|\+=|\.=)"  # a plain assignment in a kas file's local.conf

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
    # admin access (alma.imagebuild.access): a release image needs a key to be reachable
    admin_keys: tuple[Path, ...] = ()
    no_admin_access: bool = False
    ota_cert: Path | None = None  # feature ota's signing certificate (alma.imagebuild.ota)
    # kas parity: what kas itself would resolve, checked against our plan
    targets: tuple[str, ...] = ()  # --target (repeatable): recipes other than the image (bitbake's targets)
    task: str | None = None  # bitbake -c TASK
    machine_given: bool = False  # --machine was on the command line (else KAS_MACHINE may choose)
    image_given: bool = False  # --image was on the command line (else the kas files' target may choose)
    keep_going: bool = False  # bitbake -k
    bitbake_args: tuple[str, ...] = ()  # after `--`: passed to bitbake verbatim (quoted)
    kas_files: tuple[str, ...] = ()  # --kas-file a.yml[:b.yml]: more kas files, after the features
    shell: str | None = None  # alma shell: the command for kas shell -c ("" = interactive)
    update: bool = False  # kas --update: follow the branch heads (ignores the lock)
    force_checkout: bool = False  # kas --force-checkout: discard local changes in the repositories


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
    kas_view: KasView | None = None  # what kas will build (MACHINE, DISTRO, targets, task) and from where

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
            "kas": self.kas_view.to_dict() if self.kas_view else None,
            "tmpdir": {
                "value": str(self.tree.bitbake_tmpdir(self.request.machine)),
                "source": self.tree.source("TMPDIR"),
            },
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


def choose_jobs(
    req: BuildRequest, probes: Probes | None, kas_sets: tuple[str, ...] = ()
) -> tuple[int | None, int | None, list[str]]:
    """(BB_NUMBER_THREADS, PARALLEL_MAKE -j, notes) for this host.

    bitbake's defaults are one task per CPU and make -j <CPUs> inside each, CPUs² compilers:
    both are set so that their product fits the RAM (2 GiB per compiler).
    """
    if probes is None or (req.check and req.jobs is None):
        return req.jobs, None, []
    from alma.imagebuild import preflight as pf

    if req.jobs is None and kas_sets:  # the kas files chose: the same value in alma build and alma shell
        what = " and ".join(kas_sets)
        return None, None, [f"jobs: {what} as the kas files set (local_conf_header); --jobs overrides"]

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


def kas_sets(kas: KasConfig, *names: str) -> tuple[str, ...]:
    """Which of ``names`` the kas files' local_conf_header assigns (kas writes it into local.conf)."""
    text = "\n".join(str(v) for v in (kas.data.get("local_conf_header") or {}).values() if v)
    return tuple(n for n in names if re.search(_SETS_VAR.format(re.escape(n)), text, re.M))


_TMPDIR_SET = re.compile(r'^[ \t]*(?:export[ \t]+)?TMPDIR[ \t]*:?=[ \t]*"([^"]*)"[ \t]*$', re.M)


def kas_tmpdir(kas: KasConfig, topdir: Path) -> tuple[str | None, str | None]:
    """bitbake's TMPDIR as the kas files set it in local_conf_header (kas writes the blocks in
    key order; the last plain assignment wins, and beats an exported TMPDIR): (path, None), or
    (None, the expression) when it is not a literal path alma can resolve (only ${TOPDIR} is)."""
    blocks = kas.data.get("local_conf_header") or {}
    found = [m.group(1) for _k, v in sorted(blocks.items()) if isinstance(v, str) for m in _TMPDIR_SET.finditer(v)]
    if not found:
        return None, None
    value = found[-1].replace("${TOPDIR}", str(topdir))
    if "${" in value or not value.startswith("/"):
        return None, found[-1]
    return value, None  # as written: bitbake appends -glibc to this text


def _check_names(req: BuildRequest) -> None:
    for target in req.targets:
        if not _RECIPE.match(target):
            raise UserError(
                f"--target {target!r}: not a recipe name", hint="alma build --target busybox  (or virtual/kernel)"
            )
    if req.task is not None and not _TASK.match(req.task):
        raise UserError(
            f"--task {req.task!r}: not a task name", hint="alma build --task fetch  (compile, cleansstate, ...)"
        )


def machine_of(machine: str, given: bool, env: Mapping[str, str], project: Project) -> str:
    """The MACHINE kas will use: kas takes an exported KAS_MACHINE whatever its files say, so
    alma does too (its kas file and its build dir), or refuses when ``--machine`` (``given``)
    asks for another or ALMA-OS has no kas file for it."""
    exported = env.get("KAS_MACHINE")
    if exported is None:
        return machine
    if exported != machine:
        if given:
            raise UserError(
                f"KAS_MACHINE={exported} is exported but --machine is {machine}: kas would build {exported}",
                hint=f"unset KAS_MACHINE, or drop --machine (alma builds the exported {exported})",
            )
        machine = exported
    if machine not in project.machines():
        raise UserError(
            f"KAS_MACHINE={machine} is exported, but ALMA-OS has no kas/machines/{machine}.yml "
            f"(valid machines: {', '.join(project.machines())})",
            hint="unset KAS_MACHINE, or export one of the valid machines",
        )
    return machine


def _distro_problem(view: KasView, kas: KasConfig) -> tuple[str, str] | None:
    meant = kas.data.get("distro")
    if view.distro.source.startswith("environment") and view.distro.value != meant:
        return (
            f"KAS_DISTRO={view.distro.value} is exported: kas would build DISTRO {view.distro.value!r} instead of "
            f"the kas files' {meant!r} (no ALMA release mode, admin access or layer checks)",
            "unset KAS_DISTRO (the distro is part of the kas files: kas/alma.yml)",
        )
    return None


def _tmpdir_note(tree: BuildTree, machine: str, expr: str | None) -> str:
    if expr:
        return (
            f"TMPDIR: the kas files set bitbake's TMPDIR to {expr!r}, which alma cannot resolve: the disk check "
            "measures the build tree and alma verify looks there; pass the deploy dir to alma verify"
        )
    where = tree.bitbake_tmpdir(machine)
    if tree.source("TMPDIR") == "environment":
        why = (
            "TMPDIR is exported and kas passes it to bitbake (BB_ENV_PASSTHROUGH_ADDITIONS); oe-core appends "
            "-glibc. A login's TMPDIR (libpam-tmpdir) may be small or cleared at reboot: the disk check measures it; "
            "to keep the output in the build tree: env -u TMPDIR alma build …"
        )
    else:
        why = "the kas files' local_conf_header sets it; oe-core appends -glibc"
    return f"TMPDIR (bitbake's build output, deploy dir under it): {where}  ({why})"


def bitbake_command(req: BuildRequest, view: KasView, conf_path: Path) -> str:
    bb = f"bitbake -R {shlex.quote(str(conf_path))}"
    image = shlex.quote(req.image)
    if req.check:
        return f"{bb} -p && {bb} -g {image}"
    task = str(view.task.value)
    opts = (["-k"] if req.keep_going else []) + (["-c", shlex.quote(task)] if task != "build" else [])
    targets = list(view.targets.value)
    if not req.targets and view.targets.source != "environment KAS_TARGET" and req.image_given:
        targets = [req.image]  # --image names the image; the kas files' target is its default
    extra = [shlex.quote(a) for a in req.bitbake_args]
    return " ".join([bb, *opts, *(shlex.quote(t) for t in targets), *extra])


def cli_request(machine: str | None, image: str | None, **options: Any) -> BuildRequest:
    """The request of `alma build` / `alma shell`: the project's default machine and image
    where none was given, and whether each was (else KAS_MACHINE or the kas files choose)."""
    return BuildRequest(
        machine=machine or DEFAULT_MACHINE,
        image=image or DEFAULT_IMAGE,
        machine_given=machine is not None,
        image_given=image is not None,
        **options,
    )


def make_plan(req: BuildRequest, project: Project, probes: Probes | None = None) -> BuildPlan:
    """Validate everything offline and compute the exact command. Raises UserError/ConfigError.

    ``probes`` (the host) sizes the parallelism; without it bitbake's defaults stand."""
    env = probes.env if probes is not None else os.environ
    project.require_layout()
    req = replace(req, machine=machine_of(req.machine, req.machine_given, env, project))
    files = project.kas_files(req.machine, req.features) + project.extra_kas_files(req.kas_files)
    project.check_image(req.image)
    _check_names(req)
    if req.jobs is not None and req.jobs < 1:
        raise UserError(f"--jobs {req.jobs}: must be at least 1", hint="alma build --jobs 4")
    kas = load_kas(project, files)
    view = resolve(kas.data, env, targets=req.targets, task=req.task)
    for name in view.targets.value:
        if not _RECIPE.match(str(name)):
            raise UserError(f"target {name!r} ({view.targets.source}): not a recipe name", hint="unset KAS_TARGET")
    if not _TASK.match(str(view.task.value)):
        raise UserError(f"task {view.task.value!r} ({view.task.source}): not a task name", hint="unset KAS_TASK")
    unpinned = [r for r in kas.repos(project.root) if r.url and not (r.commit and FULL_SHA.match(r.commit))]
    if unpinned:
        what = ", ".join(
            f"{r.repo_id} ({'commit: ' + r.commit if r.commit else 'branch: ' + str(r.branch)})" for r in unpinned
        )
        raise ConfigError(
            f"repositories not pinned to a full 40-hex commit: {what}; a build must be reproducible",
            hint="pin them: set commit: <40-hex sha> in the kas file, or run: alma lock (then review the lock)",
        )
    kas_env = {k: str(v) for k, v in (kas.data.get("env") or {}).items() if v is not None}
    topdir = build_tree(project.root, req.build_dir, env, kas_env).machine_dir(req.machine)
    tmp_from_kas, tmp_expr = kas_tmpdir(kas, topdir)
    tree = build_tree(project.root, req.build_dir, env, kas_env, tmp_from_kas)
    machine_dir = tree.machine_dir(req.machine)
    conf_path = machine_dir / CONF_NAME
    jobs, make_jobs, notes = choose_jobs(req, probes, kas_sets(kas, "BB_NUMBER_THREADS", "PARALLEL_MAKE"))
    jobs_auto = req.jobs is None and jobs is not None
    conf_text = render_conf(req, jobs, make_jobs)
    # admin keys for the image, decided offline (a release without one is a problem)
    conf_text, access_note, access_problem = _with_admin_access(req, project, kas, conf_text)
    notes.append(access_note)
    ota_text, ota_problem, ota_notes = _with_ota(req, project, kas, machine_dir)  # a cert for a release
    notes += ota_notes
    conf_text += ota_text
    if tree.tmp_dir is not None or tmp_expr:
        notes.append(_tmpdir_note(tree, req.machine, tmp_expr))
    rel = [str(f.relative_to(project.root)) for f in files]
    from alma.imagebuild.preflight import _find_kas  # the path kas will really run from

    for pin in kas.repos(tree.work_dir):
        state = pin.state()
        if state:
            notes.append(f"repository {pin.repo_id}: {state}")
    kas_opts = (["--update"] if req.update else []) + (["--force-checkout"] if req.force_checkout else [])

    if req.shell is not None:
        # bitbake reads BBPOSTCONF as if given -R (bitbake/lib/bb/main.py): bitbake typed in the
        # shell reads the plan's config at the same point as alma build's bitbake -R. kas hands
        # the shell only its own environment, so the export is part of the command.
        post = f"export BBPOSTCONF={shlex.quote(str(conf_path))}; "
        cmd = post + (req.shell or 'exec "${SHELL:-/bin/sh}"')
        argv = [_find_kas() or "kas", "shell", *kas_opts, ":".join(rel), "-c", cmd]
    else:
        argv = [_find_kas() or "kas", "shell", *kas_opts, ":".join(rel), "-c", bitbake_command(req, view, conf_path)]
    env_added = {**tree.env(), "KAS_BUILD_DIR": str(machine_dir)}
    problems = [project.vcs_problem(), access_problem, ota_problem, _distro_problem(view, kas)]
    return BuildPlan(
        request=req,
        root=project.root,
        kas_files=files,
        kas=kas,
        tree=tree,
        machine_dir=machine_dir,
        conf_path=conf_path,
        conf_text=conf_text,
        env=env_added,
        argv=argv,
        jobs=jobs,
        jobs_auto=jobs_auto,
        notes=notes,
        make_jobs=make_jobs,
        problems=[p for p in problems if p is not None],
        kas_view=view,
    )
