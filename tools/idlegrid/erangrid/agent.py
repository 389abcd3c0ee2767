"""The agent: one ``step()`` per poll, a pure decision over what the machine says.

Order of precedence, every poll: privacy (refuse) > power > heat > owner > coordinator. A job
runs only while all say yes; otherwise it is stopped (SIGSTOP of its whole process group) in
the same poll, and a job stopped longer than ``vacate_after`` is asked to checkpoint (SIGTERM,
SIGKILL after ``grace``) and goes back to the queue with its checkpoint, counted as a yield.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from almaboard.files import boot_id, iso, read_json_object, write_atomic, write_json

from . import power, presence, privacy, thermal
from .config import Config
from .errors import CoordinatorUnreachable, GridError, UserError
from .jobs import Backend, Job, Lease, Outcome, job_dir, job_id_problem, pack_checkpoint, unpack_checkpoint
from .process import JobProcess, Limits, Stranger, proc_start, stop_leftovers

FD_CHECK_EVERY = 5  # slow polls between checks of our own open files for capture devices
STATUS_REFRESH = 5.0  # seconds; `eran-grid status` trusts a status file younger than 5 of these


@dataclass(frozen=True)
class Conditions:
    on_ac: bool
    heat: thermal.Heat
    activity: presence.Activity
    now: float

    def idle_for(self) -> float:
        return float("inf") if self.activity.at is None else max(0.0, self.now - self.activity.at)


def ago(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def blocking_reason(
    cfg: Config,
    cond: Conditions,
    hot_until: float | None = None,
    coord_down_since: float | None = None,
    coord_error: str = "",
) -> str:
    """Why work may not run now, or '' when it may. The agent and `status` share it."""
    if not cond.on_ac:
        return "on battery"
    if cond.heat.hot:
        return f"hot: {cond.heat.reason}"
    if hot_until is not None and cond.now < hot_until:
        return f"cooling: resume in {ago(hot_until - cond.now)}"
    idle = cond.idle_for()
    if idle < cfg.idle_after:
        return f"owner active {ago(idle)} ago ({cond.activity.what})"
    if coord_down_since is not None:
        return f"coordinator unreachable since {iso(coord_down_since)}: {coord_error}"
    return ""


class Sensors:
    """Reads the machine. Every path comes from ``cfg.machine`` (tests pass a fake tree)."""

    def __init__(
        self, cfg: Config, clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self.cpu = presence.CpuLoad(cfg.machine.proc, cfg.cpu_window, monotonic)
        self.cpu_busy_at: float | None = None
        self.cpu_share: float | None = None
        self._monotonic = monotonic
        self._slow_next = float("-inf")
        self._ttys_next = float("-inf")
        self._vts: list[str] = []
        self._heat = thermal.Heat(False, "")
        self.zones = thermal.ZoneWatch(cfg.machine.thermal, cfg.plausibility)
        self._on_ac = True
        self.sessions = presence.SessionWatch(cfg.machine.sessions, monotonic=monotonic)
        self._boot = boot_id(cfg.machine.proc / "sys/kernel/random/boot_id")

    def read(self, job_pgid: int | None = None) -> Conditions:
        """Owner presence every poll (the 0.2 s promise); power, heat and CPU load, which move
        on a scale of seconds, every ``slow_poll``: this keeps an idle agent near zero CPU."""
        cfg, m = self.cfg, self.cfg.machine
        now = self.clock()
        mono = self._monotonic()
        if mono >= self._slow_next:
            self._slow_next = mono + cfg.slow_poll * 0.999
            heat = thermal.zone_heat(self.zones.read(mono), cfg.max_temp_c, cfg.zone_max_c)
            if not heat.hot:
                heat = thermal.guard_heat(m.guard_state, cfg.guard_stale_after, cfg.require_guard, now, boot=self._boot)
            self._heat = heat
            self._on_ac = power.on_ac(m.power_supply)
            if cfg.cpu_busy < 1.0:
                self.cpu_share = self.cpu.sample(job_pgid)
                if self.cpu_share is not None and self.cpu_share > cfg.cpu_busy:
                    self.cpu_busy_at = now
        return Conditions(self._on_ac, self._heat, self.owner(now), now)

    def owner(self, now: float) -> presence.Activity:
        """The owner's latest activity: terminals and logind sessions as they are now (a stat
        each while nothing changed), CPU load as of the last slow poll. Cheap enough to ask
        between polls (:meth:`Agent.run`)."""
        m = self.cfg.machine
        mono = self._monotonic()
        if mono >= self._ttys_next:  # consoles come and go rarely; /dev/pts is rescanned every time
            self._ttys_next = mono + 5.0
            self._vts = presence.consoles(m.dev, self.cfg.include_serial_ttys)
        tty = presence.tty_activity(presence.pseudo_terminals(m.dev_pts) + self._vts)
        sess = self.sessions.read(now)
        cpu = presence.Activity(self.cpu_busy_at, f"cpu {100 * (self.cpu_share or 0):.0f} %")
        return max(
            (a for a in (tty, sess, cpu) if a.at is not None),
            key=lambda a: a.at or 0.0,
            default=presence.Activity(None, ""),
        )


def resolve_stranger(job_user: str) -> Stranger | None:
    """The uid/gid jobs run under, or None (job_user unset). The uid is job_user's; the gid is
    the agent's own primary group (the unit's UMask=0077 leaves every agent file without
    group access, so sharing it gives the job nothing, and lets the agent read the job's
    checkpoint without SupplementaryGroups=). An agent running as root (a developer
    machine, CI) gives the job the job user's own group instead: root's group is not to
    share. The agent must be able to switch: root, or CAP_SETUID + CAP_SETGID."""
    if not job_user:
        return None
    import pwd

    try:
        entry = pwd.getpwnam(job_user) if not job_user.isdigit() else pwd.getpwuid(int(job_user))
        uid, own_gid = entry.pw_uid, entry.pw_gid
    except KeyError:
        if not job_user.isdigit():
            raise UserError(
                f"job_user {job_user!r} does not exist",
                hint="the image creates eran-job (useradd in eran-grid's recipe); or set job_user to a free uid",
            ) from None
        uid = own_gid = int(job_user)
    if uid == 0 or uid == os.geteuid():
        raise UserError(f"job_user {job_user!r} is uid {uid}: a job must not run as root or as the agent")
    if os.geteuid() == 0:
        return Stranger(uid, own_gid)
    if not _has_caps(("CAP_SETUID", "CAP_SETGID")):
        raise UserError(
            f"cannot run jobs as {job_user!r}: the agent lacks CAP_SETUID/CAP_SETGID",
            hint="eran-grid.service grants them (AmbientCapabilities=); check the unit",
        )
    return Stranger(uid, os.getegid())


_CAP_BITS = {"CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7}


def _has_caps(names: tuple[str, ...], status: Path = Path("/proc/self/status")) -> bool:
    try:
        line = next(x for x in status.read_text().splitlines() if x.startswith("CapEff:"))
        eff = int(line.split()[1], 16)
    except (OSError, StopIteration, ValueError, IndexError):
        return False
    return all(eff >> _CAP_BITS[n] & 1 for n in names)


class HomeMeter:
    """Bytes and inodes under a job's HOME (symlinks not followed), walked at most ``budget``
    entries per call: the walk resumes where the last call stopped (a directory iterator kept
    open across polls), so its work per poll is bounded however many files the job makes.

    200,000 empty files in HOME once cost a ~2 s walk every few slow polls, run before the
    owner check, and counted 4.5 MB of blocks against a 256 MiB cap: the owner waited 1 s for
    the stop, and an inode flood was never capped. A partial count only grows within a pass,
    so a cap it crosses is crossed for certain; the job is judged as the walk goes."""

    def __init__(self, top: Path, budget: int = 2000) -> None:
        self.top = top
        self.budget = budget
        self.work = 0  # entries examined by the last call (what a test bounds)
        self.passes = 0
        self._stack: list[str] = [str(top)]
        self._it: Any = None
        self._bytes = 0
        self._inodes = 0

    def step(self) -> tuple[int, int]:
        """Walk on; return (bytes, inodes) counted so far in this pass (the whole pass's when
        it just ended: the next call starts a new one)."""
        n = 0
        while n < self.budget:
            if self._it is None:
                if not self._stack:
                    done = (self._bytes, self._inodes)
                    self.passes += 1
                    self._stack, self._bytes, self._inodes = [str(self.top)], 0, 0
                    self.work = n
                    return done
                try:
                    self._it = os.scandir(self._stack.pop())
                except OSError:
                    continue
            try:
                entry = next(self._it)
            except (StopIteration, OSError):
                self._it.close()
                self._it = None
                continue
            n += 1
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            self._bytes += st.st_blocks * 512
            self._inodes += 1
            if entry.is_dir(follow_symlinks=False):
                self._stack.append(entry.path)
        self.work = n
        return self._bytes, self._inodes

    def close(self) -> None:
        if self._it is not None:
            self._it.close()
            self._it = None


LOCK_NAME = "agent.lock"


class AlreadyRunning(UserError):
    """Another agent holds this state dir: it owns the job and the lease in there."""


def hold_instance_lock(state_dir: Path) -> int:
    """Take ``state_dir/agent.lock`` for this process's lifetime and return its descriptor.

    A second agent on the same state dir would take the first one's job directory for a
    crashed run's: stop its job (SIGKILL) and release its lease. flock() is held until the
    process dies (the kernel drops it with the last descriptor, kill -9 included), so a
    stale lock file never blocks a restart. The holder writes its pid into the file so the
    refusal can name it."""
    import fcntl

    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        who = f"pid {holder}" if holder.isdigit() else "a process that has not written its pid yet"
        raise AlreadyRunning(
            f"another eran-grid agent ({who}) holds {path}: one agent per state dir",
            hint="stop that agent first (systemctl stop eran-grid), or give this one its own state_dir",
        ) from None
    except OSError:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _job_env(job: Job, home: Path, ckpt: Path) -> dict[str, str]:
    """The job's whole environment: a few of the agent's (locale, PATH) and its own."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH")}
    env.update(
        {
            "ERAN_GRID_JOB_ID": job.id,
            "ERAN_GRID_INPUT": str(home / "input"),
            "ERAN_GRID_ATTEMPT": str(job.attempts),
            "HOME": str(home),
            "TMPDIR": str(home),
        }
    )
    if job.checkpoint:
        env["ERAN_GRID_CHECKPOINT_DIR"] = str(ckpt)
    return env


class Agent:
    def __init__(
        self,
        cfg: Config,
        backend: Backend,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sensors: Sensors | None = None,
        spawn: Callable[..., JobProcess] = JobProcess,
        log: Callable[[str], None] | None = None,
        fd_dir: Path = Path("/proc/self/fd"),
    ) -> None:
        self.cfg = cfg
        self.backend = backend
        self.fd_dir = fd_dir
        self._monotonic = monotonic
        self._fds_next = float("-inf")
        self._claim_next = float("-inf")
        self.clock = clock
        self.sensors = sensors or Sensors(cfg, clock, monotonic)
        self.spawn = spawn
        self.log = log or (lambda line: None)
        self.lease: Lease | None = None
        self.proc: JobProcess | None = None
        self.started_at = 0.0
        self.paused_since: float | None = None
        self.pause_reason = ""
        self.term_sent_at: float | None = None
        self.last_hb = 0.0
        self.lease_valid_until = 0.0
        self.ckpt_digest = ""
        self.hot_until: float | None = None  # heat hold-off: no work before this time
        self.coord_down_since: float | None = None
        self.coord_error = ""
        self._coord_retry_at = 0.0
        self.pending: tuple[Lease, Outcome] | None = None  # a result the coordinator has not taken yet
        self.line = "starting"
        self.stats = {"done": 0, "failed": 0, "yields": 0, "pauses": 0, "lost": 0}
        self._status_written = float("-inf")
        self._status_key = ""
        self._status_line = ""
        self._extra_majors = frozenset[int]()
        self.stranger: Stranger | None = None
        self.home_meter: HomeMeter | None = None  # the running job's HOME, walked a little every poll
        self._lock_fd: int | None = None  # the state dir's lock, held for the process's life

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> int:
        """Checks that must pass before any work: opt-in, one agent per state dir, the empty
        sensor set, our own files. Then connect and release this node's leases left by a
        previous run."""
        self.cfg.require_opt_in("the configuration")
        self._lock_fd = hold_instance_lock(self.cfg.state_dir)
        privacy.assert_empty_sensor_set()
        self._extra_majors = privacy.dynamic_capture_majors(self.cfg.machine.proc / "devices")
        privacy.assert_no_sensor_fds(self.fd_dir, self._extra_majors)
        self.stranger = resolve_stranger(self.cfg.job_user)
        if self.stranger is None:
            self.log("WARNING: job_user is not set: jobs run as the agent's own user (development only)")
        work = self.cfg.state_dir / "work"
        work.mkdir(parents=True, exist_ok=True)
        if self.stranger is not None:
            for parent in self.cfg.state_dir.resolve().parents:
                if not os.stat(parent).st_mode & 0o001:
                    raise UserError(
                        f"job_user cannot reach its HOME: {parent} is not searchable by others",
                        hint=f"chmod o+x {parent} (StateDirectoryMode=0711 does it for {self.cfg.state_dir})",
                    )
        # A stranger may traverse to its own HOME, never list or write what is here.
        os.chmod(work, 0o711 if self.stranger else 0o700)
        self._recover()
        if self.pending is not None:
            return 0  # the coordinator is down: keep our lease until the result is taken
        try:
            released = self.backend.open(self.cfg.node)
        except CoordinatorUnreachable as exc:
            self._coord_down(exc)
            return 0
        if released:
            self.log(f"released {released} lease(s) left by this node's previous run")
        return released

    # -- what a previous run of this agent left -------------------------------------------
    def _boot_id(self) -> str:
        try:
            return (self.cfg.machine.proc / "sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            return "unknown"

    def _recover(self) -> None:
        """Before anything is claimed or released: stop whatever is left of the job a previous
        run held (its process group, its cgroup), then record the result its wrapper wrote,
        if it finished, instead of letting the job run again (effectively once)."""
        work = self.cfg.state_dir / "work"
        boot = self._boot_id()
        for d in sorted(p for p in work.iterdir() if p.is_dir()):
            if job_id_problem(d.name):
                shutil.rmtree(d, ignore_errors=True)  # not a job's directory: nothing to recover
                continue
            what = stop_leftovers(d, boot)
            if what:
                self.log(f"job {d.name}: stopped what the previous run left behind ({what})")
            lease = read_json_object(d / "lease.json")
            done = read_json_object(d / "exit.json")
            if not lease.get("token") or done.get("schema") != "alma.eran-grid-exit/1":
                shutil.rmtree(d, ignore_errors=True)  # unfinished: open() requeues the lease
                continue
            job = Job(id=d.name, command=[str(a) for a in lease.get("command", [])])
            held = Lease(job=job, token=str(lease["token"]))
            rc = done.get("exit_code")
            if rc == 0 and self.pending is None:
                try:
                    size = int(done.get("stdout_bytes", 0))
                    data = (d / "stdout").read_bytes()[:size]
                except (OSError, ValueError):
                    shutil.rmtree(d, ignore_errors=True)
                    continue
                if len(data) != size or size > self.cfg.result_max_bytes:
                    shutil.rmtree(d, ignore_errors=True)
                    continue
                self.log(f"job {job.id} finished while the agent was down: recording its result, not running it again")
                self.pending = (held, Outcome("done", data, 0))
                self.stats["done"] += 1
                self._retry_pending()
            elif isinstance(rc, int) and rc != 0:
                why = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
                if isinstance(done.get("limit"), str) and done["limit"]:
                    why = str(done["limit"])
                try:
                    state = self.backend.fail(held, f"{why} (recorded after an agent restart)", None)
                    self.log(f"job {job.id} failed while the agent was down ({why}): {state}")
                except CoordinatorUnreachable as exc:
                    self._coord_down(exc)
                shutil.rmtree(d, ignore_errors=True)

    def shutdown(self) -> None:
        """Stopping the agent yields the running job (checkpoint, requeue), never loses it."""
        if self.proc is not None and self.lease is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=self.cfg.grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc.reap_group()  # what the job left behind (its group, its cgroup)
            self._yield("agent stopping")
        self.backend.close()
        if self._lock_fd is not None:  # nothing of ours is left in the state dir
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- one poll ---------------------------------------------------------------------------
    def step(self) -> str:
        mono = self._monotonic()
        if mono >= self._fds_next:
            self._fds_next = mono + FD_CHECK_EVERY * self.cfg.slow_poll * 0.999
            privacy.assert_no_sensor_fds(self.fd_dir, self._extra_majors)
        cond = self.sensors.read(self.proc.pgid if self.proc is not None and self.proc.poll() is None else None)
        now = cond.now
        if cond.heat.hot:
            self.hot_until = now + self.cfg.heat_holdoff
        if self.pending is not None:
            self._retry_pending()
        if self.proc is not None:
            self.line = self._step_running(cond)
        else:
            self.line = self._step_idle(cond)
        self._write_status(now)
        return self.line

    def blocking_reason(self, cond: Conditions) -> str:
        return blocking_reason(self.cfg, cond, self.hot_until, self.coord_down_since, self.coord_error)

    def _coord_down(self, exc: CoordinatorUnreachable) -> None:
        if self.coord_down_since is None:
            self.coord_down_since = self.clock()
            self.log(f"coordinator unreachable: {exc}")
        self.coord_error = str(exc)

    def _coord_up(self) -> None:
        if self.coord_down_since is not None:
            self.log("coordinator reachable again")
        self.coord_down_since = None
        self.coord_error = ""

    def _step_idle(self, cond: Conditions) -> str:
        reason = self.blocking_reason(cond)
        if self.coord_down_since is not None and reason.startswith("coordinator") and cond.now >= self._coord_retry_at:
            self._coord_retry_at = cond.now + 2.0  # don't hammer a coordinator that is down
            try:
                self.backend.ping()
                if self.pending is not None:
                    self._retry_pending()  # before open() could release that lease as lost
                self.backend.open(self.cfg.node)
                self._coord_up()
                reason = self.blocking_reason(cond)
            except CoordinatorUnreachable as exc:
                self._coord_down(exc)
        if reason:
            return reason
        if self.pending is not None:
            return f"holding the result of job {self.pending[0].job.id}: coordinator has not taken it yet"
        mono = self._monotonic()
        if mono < self._claim_next:  # the queue was empty a moment ago: ask again every slow_poll
            return self.line if self.line.startswith("idle") else "idle: queue empty"
        try:
            lease = self.backend.claim(self.cfg.node)
        except CoordinatorUnreachable as exc:
            self._coord_down(exc)
            return self.blocking_reason(cond)
        self._coord_up()
        self._claim_next = mono + self.cfg.slow_poll * 0.999 if lease is None else float("-inf")
        if lease is None:
            return f"idle {ago(cond.idle_for())}: queue empty" if cond.activity.at else "idle: queue empty"
        self._start(lease, cond.now)
        if self.proc is None:
            return f"job {lease.job.id} could not start (recorded as a failure)"
        return f"running job {lease.job.id}"

    def _fresh_workdir(self, job_id: str) -> Path:
        """The job's directory, emptied, with its HOME (``home``) inside."""
        workdir = job_dir(self.cfg.state_dir, job_id)
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True)
        home = workdir / "home"
        home.mkdir()
        if self.stranger is not None:
            # The agent's records (lease.json, stdout, exit.json) are 0600 in a 0711 directory;
            # HOME is the job's: the group the two share (resolve_stranger), so what the job
            # writes (umask 007) stays readable (its checkpoint) and removable by the agent.
            os.chmod(workdir, 0o711)
            os.chown(home, -1, self.stranger.gid)
            os.chmod(home, 0o770)
        return workdir

    def _start(self, lease: Lease, now: float) -> None:
        job = lease.job
        self.lease = lease
        why = job_id_problem(job.id)  # the backends check it too; no path from unchecked text
        if why:
            self.proc = None
            self._fail(why)
            return
        workdir = self._fresh_workdir(job.id)
        home = workdir / "home"
        ckpt = home / "checkpoint"
        try:
            restored = unpack_checkpoint(lease.checkpoint, ckpt)
        except GridError as exc:  # a corrupt or hostile checkpoint (unpack_checkpoint says which)
            self.proc = None
            self._fail(f"unusable checkpoint: {exc}")
            return
        (home / "input").write_bytes(job.input)
        if self.stranger is not None:
            for path in (ckpt, *ckpt.iterdir(), home / "input"):
                os.chown(path, -1, self.stranger.gid)
                os.chmod(path, 0o770 if path.is_dir() else 0o660 if path.parent == ckpt else 0o640)
        env = _job_env(job, home, ckpt)
        self.ckpt_digest = hashlib.sha256(lease.checkpoint or b"").hexdigest()
        self.last_hb = now
        self.lease_valid_until = now + self.cfg.lease_ttl
        record: dict[str, Any] = {
            "job": job.id,
            "token": lease.token,
            "node": self.cfg.node,
            "command": job.command,
            "boot_id": self._boot_id(),
        }
        parent = self.cfg.job_cgroup
        extra: dict[str, Any] = {}
        if parent is not None:
            extra["cgroup_parent"] = parent
            record["cgroup"] = str(parent / f"eran-grid-job-{workdir.name}")
        try:
            write_json(workdir / "lease.json", record)  # before the job exists: a crash now leaves a trail
            self.proc = self.spawn(
                job.command,
                workdir,
                home / "input",
                env,
                home=home,
                stranger=self.stranger,
                limits=Limits(self.cfg.result_max_bytes, self.cfg.stderr_max_bytes, self.cfg.job_disk_max_bytes),
                **extra,
            )
        except OSError as exc:
            self.proc = None
            self._fail(f"cannot start {job.command[0]}: {exc.strerror}")
            return
        cgroup = getattr(self.proc, "cgroup", None)
        record["cgroup"] = str(cgroup) if cgroup else None
        record["wrapper_start"] = proc_start(self.proc.pid)
        with contextlib.suppress(OSError):
            write_json(workdir / "lease.json", record)
        self.started_at = now
        self.paused_since = None
        self.term_sent_at = None
        self.sensors.cpu.reset()
        self.log(
            f"job {job.id} started (attempt {job.attempts}, {job.yields} yields"
            f"{f', resumed from a {restored}-file checkpoint' if restored else ''})"
        )

    def _checkpoint(self) -> bytes | None:
        """The job's checkpoint directory packed, or None (none, or unusable: the queue keeps
        the previous one rather than the agent dying over a job's oversized files)."""
        if self.lease is None or not self.lease.job.checkpoint:
            return None
        try:
            return pack_checkpoint(
                job_dir(self.cfg.state_dir, self.lease.job.id) / "home" / "checkpoint", self.cfg.checkpoint_max_bytes
            )
        except (GridError, OSError) as exc:
            self.log(f"job {self.lease.job.id}: checkpoint not saved: {exc}")
            return None

    def _step_running(self, cond: Conditions) -> str:
        assert self.proc is not None and self.lease is not None
        job_id = self.lease.job.id
        rc = self.proc.poll()
        if rc is not None:
            self.proc.reap_group()
            if self.term_sent_at is not None:
                why = self.pause_reason or "vacated"  # _yield clears pause_reason
                self._yield(why)
                return f"yielded job {job_id} ({why}): requeued with its checkpoint"
            self._finished(rc)
            return f"job {job_id} exited {rc}"

        # The owner first: the stop (or resume) below happens before any other work of this
        # poll; HOME is measured after it, a bounded slice at a time.
        line = self._decide_running(cond, job_id)
        if self.proc is not None and self.lease is not None:
            over = self._home_over_cap()
            if over:
                self.proc.kill()
                self.proc.wait()
                self._fail(f"{over}: killed")
                return f"job {job_id} killed: {over}"
        return line

    def _home_over_cap(self) -> str:
        """One bounded slice of the walk of the running job's HOME; why it is over its cap, or ''."""
        assert self.lease is not None
        if self.home_meter is None:
            self.home_meter = HomeMeter(job_dir(self.cfg.state_dir, self.lease.job.id) / "home")
        used, inodes = self.home_meter.step()
        if used > self.cfg.job_disk_max_bytes:
            return f"disk use over job_disk_max_bytes ({self.cfg.job_disk_max_bytes})"
        if inodes > self.cfg.job_disk_max_inodes:
            return f"files in HOME over job_disk_max_inodes ({self.cfg.job_disk_max_inodes})"
        return ""

    def _decide_running(self, cond: Conditions, job_id: str) -> str:
        assert self.proc is not None and self.lease is not None
        now = cond.now
        reason = self.blocking_reason(cond)
        if reason.startswith("coordinator"):
            reason = ""  # the job computes locally; the lease check below decides when to stop
        if reason and self.term_sent_at is None and not self.proc.stopped:
            self._pause(job_id, reason, now)  # before the heartbeat: its checkpoint and fsync can wait
        if now - self.last_hb >= self.cfg.lease_ttl / 3:
            self._heartbeat(now)
            if self.proc is None:
                return f"lost the lease on job {job_id}: stopped it"

        if self.term_sent_at is not None:
            if now - self.term_sent_at >= self.cfg.grace:
                self.proc.kill()
                self.proc.wait()
                why = self.pause_reason or "vacated"  # _yield clears pause_reason
                self._yield(why + ", killed after grace")
                return f"yielded job {job_id} ({why}): killed after {ago(self.cfg.grace)} grace"
            return f"vacating job {job_id} ({self.pause_reason}): waiting for its checkpoint"

        if reason:
            if not self.proc.stopped:
                self._pause(job_id, reason, now)
            self.pause_reason = reason
            assert self.paused_since is not None
            if now - self.paused_since >= self.cfg.vacate_after:
                self.log(f"job {job_id} paused {ago(now - self.paused_since)}: asking it to checkpoint and stop")
                self.proc.terminate()
                self.term_sent_at = now
                return f"vacating job {job_id} ({reason})"
            return f"paused job {job_id}: {reason}"
        if self.proc.stopped:
            self.proc.cont()
            self.log(f"job {job_id} resumed after {ago(now - (self.paused_since or now))}")
            self.paused_since = None
        line = f"running job {job_id} for {ago(now - self.started_at)}"
        if self.coord_down_since is not None:
            line += (
                f" (coordinator unreachable since {iso(self.coord_down_since)}; the lease holds until "
                f"{iso(self.lease_valid_until)})"
            )
        return line

    def _pause(self, job_id: str, reason: str, now: float) -> None:
        assert self.proc is not None
        self.proc.stop()
        self.paused_since = now
        self.stats["pauses"] += 1
        self.log(f"job {job_id} paused: {reason}")

    def _heartbeat(self, now: float) -> None:
        assert self.lease is not None and self.proc is not None
        ckpt = self._checkpoint()
        digest = hashlib.sha256(ckpt or b"").hexdigest()
        try:
            ok = self.backend.heartbeat(self.lease, ckpt if digest != self.ckpt_digest else None)
        except CoordinatorUnreachable as exc:
            self._coord_down(exc)
            if now >= self.lease_valid_until:
                # Our lease has run out where we cannot see: the job may already run elsewhere.
                self._drop("lease ran out while the coordinator was unreachable")
            return
        self._coord_up()
        self.last_hb = now
        if not ok:
            self._drop("lease lost (expired and requeued)")
            return
        self.ckpt_digest = digest
        self.lease_valid_until = now + self.cfg.lease_ttl

    def _drop(self, why: str) -> None:
        assert self.proc is not None and self.lease is not None
        self.proc.kill()
        self.proc.wait()
        self.log(f"job {self.lease.job.id} dropped: {why}")
        self.stats["lost"] += 1
        self._cleanup()

    def _finished(self, rc: int) -> None:
        assert self.proc is not None and self.lease is not None
        if rc == 0:
            size = self.proc.stdout_path.stat().st_size
            if size > self.cfg.result_max_bytes:
                self._fail(f"result is {size} bytes, over result_max_bytes ({self.cfg.result_max_bytes})")
                return
            outcome = Outcome("done", self.proc.stdout_path.read_bytes(), 0)
            self.pending = (self.lease, outcome)
            self.stats["done"] += 1
            self.log(f"job {self.lease.job.id} done")
            self._cleanup(keep_dir=True)  # exit.json + stdout stay until the result is taken
            self._retry_pending()
            return
        limit = self.proc.limit_hit()
        if limit:
            self._fail(limit)
            return
        sig = -rc if rc < 0 else 0
        why = f"killed by {signal.Signals(sig).name}" if sig else f"exit code {rc}"
        try:
            tail = self.proc.stderr_path.read_bytes()[-1500:].decode(errors="replace").strip()
        except OSError:
            tail = ""
        self._fail(why + (f": {tail.splitlines()[-1]}" if tail else ""))

    def _retry_pending(self) -> None:
        assert self.pending is not None
        lease, outcome = self.pending
        try:
            accepted = self.backend.complete(lease, outcome)
        except CoordinatorUnreachable as exc:
            self._coord_down(exc)
            return
        self._coord_up()
        self.pending = None
        if self.lease is None or self.lease.job.id != lease.job.id:
            shutil.rmtree(job_dir(self.cfg.state_dir, lease.job.id), ignore_errors=True)
        if not accepted:
            self.log(f"result of job {lease.job.id} not recorded: the lease was lost and the job requeued")

    def _fail(self, why: str) -> None:
        assert self.lease is not None
        ckpt = self._checkpoint()
        job_id = self.lease.job.id
        try:
            state = self.backend.fail(self.lease, why, ckpt)
        except CoordinatorUnreachable as exc:
            self._coord_down(exc)
            state = "unrecorded (the lease will expire and requeue it)"
        self.stats["failed"] += 1
        self.log(f"job {job_id} failed ({why}): {state}")
        self._cleanup()

    def _yield(self, why: str) -> None:
        assert self.lease is not None
        ckpt = self._checkpoint()
        try:
            self.backend.yield_(self.lease, ckpt)
        except CoordinatorUnreachable as exc:
            self._coord_down(exc)  # the lease expires and the job is requeued anyway
        self.stats["yields"] += 1
        self.log(f"job {self.lease.job.id} yielded ({why}), checkpoint {len(ckpt or b'')} bytes")
        self._cleanup()

    def _cleanup(self, keep_dir: bool = False) -> None:
        if self.home_meter is not None:
            self.home_meter.close()
            self.home_meter = None
        if self.lease is not None and not job_id_problem(self.lease.job.id):
            workdir = job_dir(self.cfg.state_dir, self.lease.job.id)
            if keep_dir:  # the result waits for the coordinator: HOME (the job's) goes now
                shutil.rmtree(workdir / "home", ignore_errors=True)
            else:
                shutil.rmtree(workdir, ignore_errors=True)
        self.proc = None
        self.lease = None
        self.paused_since = None
        self.term_sent_at = None
        self.pause_reason = ""
        self.sensors.cpu.reset()

    # -- status -----------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return {
            "schema": "alma.eran-grid-status/1",
            "node": self.cfg.node,
            "time": iso(self.clock()),
            "updated": self.clock(),
            "line": self.line,
            "pid": os.getpid(),
            "working": self.proc is not None and not self.proc.stopped,
            "job": self.lease.job.id if self.lease else None,
            "stats": dict(self.stats),
        }

    def _write_status(self, now: float) -> None:
        """Atomically, when the state changes (digits aside: "idle 41 s" → "idle 42 s" is no
        change) and every STATUS_REFRESH seconds so readers can tell a live agent from a dead one."""
        if now - self._status_written < STATUS_REFRESH and self.line == self._status_line:
            return
        self._status_line = self.line
        key = re.sub(r"[\d.:TZ-]+", "#", self.line)
        if now - self._status_written < STATUS_REFRESH and key == self._status_key:
            return
        self._status_written = now
        self._status_key = key
        path = self.cfg.status_path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # /run is tmpfs: atomic, not durable; 0644: `eran-grid status` runs as any user
            write_atomic(path, (json.dumps(self.status()) + "\n").encode(), durable=False, mode=0o644)
        except OSError:
            pass  # status is a courtesy; never stop work (or safety) over it

    # -- the loop ---------------------------------------------------------------------------
    def interval(self) -> float:
        """``poll`` while a job exists (its owner-return promise is one poll); ``idle_poll``
        with no job: nothing needs stopping, and presence is read afresh before any claim.
        An idle agent wakes ten times less often."""
        return self.cfg.poll if self.proc is not None else max(self.cfg.poll, self.cfg.idle_poll)

    def owner_back(self) -> bool:
        """Is the owner active now, with a job running? Terminals and logind sessions only (a
        stat each): what :meth:`run` asks every ``owner_poll`` between two polls."""
        if self.proc is None or self.proc.stopped or self.term_sent_at is not None:
            return False
        now = self.clock()
        act = self.sensors.owner(now)
        return act.at is not None and now - act.at < self.cfg.idle_after

    def wait(self, until: float, should_stop: Callable[[], bool], sleep: Callable[[float], None]) -> None:
        """Sleep until the monotonic time ``until``. While a job runs, look for the owner every
        ``owner_poll`` meanwhile: his return starts the next poll at once, so the stop waits
        for an owner check, not for a whole poll (the walk of HOME, the heartbeat and the slow
        sensors keep the poll's pace)."""
        while True:
            left = until - self._monotonic()
            if left <= 0 or should_stop():
                return
            if self.proc is None or self.proc.stopped or left <= self.cfg.owner_poll:
                sleep(left)
                return
            sleep(self.cfg.owner_poll)
            if self.owner_back():
                return

    def run(self, should_stop: Callable[[], bool], sleep: Callable[[float], None] = time.sleep) -> None:
        self.start()
        last = ""
        try:
            while not should_stop():
                t0 = self._monotonic()
                try:
                    line = self.step()
                except CoordinatorUnreachable as exc:
                    self._coord_down(exc)
                    line = f"coordinator unreachable: {exc}"
                if line != last:
                    self.log(line)
                    last = line
                self.wait(t0 + self.interval(), should_stop, sleep)
        finally:
            self.shutdown()


__all__ = ["Agent", "AlreadyRunning", "Conditions", "GridError", "Sensors", "hold_instance_lock"]
