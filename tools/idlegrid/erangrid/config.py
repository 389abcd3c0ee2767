"""Configuration: one TOML file, opt-in by ``enabled = true``, every machine path injectable."""

from __future__ import annotations

import dataclasses
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from almaboard import fields as F
from almaboard.config import load_layers
from almaboard.paths import Paths
from almaboard.thermal import Plausibility

from .credentials import url_has_userinfo
from .errors import NotOptedIn, UserError

DEFAULT_CONFIG = Path("/etc/eran-grid/eran-grid.toml")


@dataclass(frozen=True)
class Machine:
    """Where the agent reads the machine. ``root`` prefixes every path, so tests point it at a
    fake tree (the same convention as ``alma-health --root``)."""

    root: Path = Path("/")
    guard_state_path: str = "/run/alma-guard/state.json"

    def _p(self, path: str) -> Path:
        return Paths(self.root)(path)

    @property
    def power_supply(self) -> Path:
        return self._p("/sys/class/power_supply")

    @property
    def thermal(self) -> Path:
        return self._p("/sys/class/thermal")

    @property
    def dev(self) -> Path:
        return self._p("/dev")

    @property
    def dev_pts(self) -> Path:
        return self._p("/dev/pts")

    @property
    def proc(self) -> Path:
        return self._p("/proc")

    @property
    def sessions(self) -> Path:
        return self._p("/run/systemd/sessions")

    @property
    def guard_state(self) -> Path | None:
        return self._p(self.guard_state_path) if self.guard_state_path else None


@dataclass(frozen=True)
class QueueConfig:
    backend: str = "sqlite"
    path: Path = Path("/var/lib/eran-grid/queue.db")
    url: str = "nats://127.0.0.1:4222"
    stream: str = "ERANGRID"
    connect_timeout: float = 2.0
    # The NATS credentials' file (erangrid.credentials): never in `url`, which this
    # world-readable file would show to every user, a job included.
    credentials: Path = Path("/etc/eran-grid/queue-credentials")


@dataclass(frozen=True)
class Config:
    enabled: bool = False
    node: str = field(default_factory=socket.gethostname)
    poll: float = 0.2  # seconds between polls; the owner's return is acted on within one
    # While a job runs, terminals and logind sessions alone are looked at this often between
    # polls (a stat each); the owner's return starts the next poll at once.
    owner_poll: float = 0.05
    slow_poll: float = 1.0  # power, heat, guard state, CPU load and our own fds: every this often
    idle_poll: float = 2.0  # how often an agent without a job wakes (nothing to stop, so no rush)
    idle_after: float = 180.0  # owner idle this long before a job is claimed or resumed
    vacate_after: float = 600.0  # a job paused this long is checkpointed, stopped and requeued
    grace: float = 30.0  # SIGTERM → SIGKILL
    heat_holdoff: float = 60.0  # cool this long after a heat pause before resuming
    max_temp_c: float = 80.0
    zone_max_c: dict[str, float] = field(default_factory=dict)
    # The guard's plausibility rules (almaboard.thermal): a zone they reject counts as hot.
    plausibility: Plausibility = field(default_factory=Plausibility)
    cpu_busy: float = 0.25  # non-grid CPU share of all cores that counts as the owner working
    cpu_window: float = 2.0
    include_serial_ttys: bool = False
    max_failures: int = 3
    lease_ttl: float = 30.0
    guard_stale_after: float = 30.0
    require_guard: bool = True
    checkpoint_max_bytes: int = 4 * 1024 * 1024
    result_max_bytes: int = 1024 * 1024
    state_dir: Path = Path("/var/lib/eran-grid")
    # Each job gets its own cgroup under this cgroup v2 directory (the work slice, which the
    # thermal guard freezes) where it is a writable cgroup; elsewhere its process group only.
    # "auto": the agent's own cgroup (eran-grid.service in alma-work.slice, Delegate=yes, so
    # the agent may create its jobs' cgroups there); a path: that cgroup; "": none.
    job_cgroup_path: str = "auto"
    # Jobs run as this user (name or uid; its primary group is shared with the agent so the
    # agent reads the job's checkpoint); "" = as the agent itself (development only).
    job_user: str = ""
    stderr_max_bytes: int = 1024 * 1024
    job_disk_max_bytes: int = 256 * 1024 * 1024
    # Files and directories in a job's HOME: empty files cost inodes, not blocks.
    job_disk_max_inodes: int = 100_000
    status_path: Path = Path("/run/eran-grid/status.json")
    machine: Machine = field(default_factory=Machine)
    queue: QueueConfig = field(default_factory=QueueConfig)

    @property
    def job_cgroup(self) -> Path | None:
        """The parent cgroup for jobs if it is a real, writable cgroup v2 directory."""
        if not self.job_cgroup_path:
            return None
        from .process import usable_cgroup_parent

        if self.job_cgroup_path == "auto":
            from .process import own_cgroup

            return usable_cgroup_parent(own_cgroup(self.machine.proc, Paths(self.machine.root)("/sys/fs/cgroup")))
        return usable_cgroup_parent(Paths(self.machine.root)(self.job_cgroup_path))

    def require_opt_in(self, source: str) -> None:
        if self.enabled is not True:
            raise NotOptedIn(
                "disabled: opt-in required",
                hint=f"set `enabled = true` in {source} (and `systemctl enable --now eran-grid`)",
            )


_TEMP = F.number(-273.0, 300.0)
_BYTES = F.integer(0, 1 << 40)
_PATH = F.string(r"[^\x00]+", max_len=4096, what="a path")
# Every key's type and range (almaboard.fields): nan, inf, booleans for numbers and negative
# periods are refused at their line. A NaN max_temp_c compared false with every reading, so
# a board at 95 C was "ready to work".
_FIELDS: F.Schema = {
    "enabled": F.boolean(),
    "node": F.string(max_len=253),
    "poll": F.duration(0.01, 5.0),
    "owner_poll": F.duration(0.01, 5.0),
    "slow_poll": F.duration(0.0, 3600.0),  # 0: every poll
    "idle_poll": F.duration(0.0, 3600.0),  # never below poll (the agent takes the larger)
    "idle_after": F.duration(0.0),
    "vacate_after": F.duration(0.0),
    "grace": F.duration(0.0, 3600.0),
    "heat_holdoff": F.duration(0.0),
    "max_temp_c": _TEMP,
    "cpu_busy": F.number(0.0, 2.0),  # a share of all cores; above 1: CPU load never counts
    "cpu_window": F.duration(above=0.0, hi=3600.0),
    "include_serial_ttys": F.boolean(),
    "max_failures": F.integer(1, 1_000_000),
    "lease_ttl": F.duration(above=0.0),
    "guard_stale_after": F.duration(above=0.0),
    "require_guard": F.boolean(),
    "checkpoint_max_bytes": _BYTES,
    "result_max_bytes": _BYTES,
    "stderr_max_bytes": _BYTES,
    "job_disk_max_bytes": _BYTES,
    "job_disk_max_inodes": F.integer(0, 1 << 40),
    "state_dir": _PATH,
    "status_path": _PATH,
    "job_user": F.string(max_len=256),
    "job_cgroup": F.string(max_len=4096),
    "root": _PATH,
    "thermal": F.table(),
    "queue": F.table(),
}
_THERMAL: F.Schema = {
    "zones": F.mapping(F.string(max_len=256), _TEMP),
    "guard_state": F.string(max_len=4096),
    "plausible_min_c": _TEMP,
    "plausible_max_c": _TEMP,
    "max_rate_c_per_s": F.number(above=0.0, hi=1e6),
}
_QUEUE: F.Schema = {
    "backend": F.enum("sqlite", "nats"),
    "path": _PATH,
    "url": F.string(max_len=4096),
    "stream": F.string(r"[A-Za-z0-9_-]+", max_len=256, what="a stream name ([A-Za-z0-9_-]+)"),
    "credentials": _PATH,
    "connect_timeout": F.duration(above=0.0, hi=3600.0),
}
_PATHS = ("state_dir", "status_path")


def from_mapping(
    data: dict[str, Any], source: str = "config", root: Path | None = None, where: F.Where | None = None
) -> Config:
    """Build a Config from parsed TOML (``where``: a key's file:line, default ``source``).
    Unknown keys are errors: a typo must not silently leave a safety limit at its default."""
    where = where or F.in_file(source)
    top = F.check(data, _FIELDS, where, hint="see docs/eran-grid.md for the configuration keys")
    kw: dict[str, Any] = {k: v for k, v in top.items() if k not in ("thermal", "queue", "root", "job_cgroup", "node")}
    kw.update({k: Path(top[k]) for k in _PATHS if k in top})
    if top.get("node"):
        kw["node"] = top["node"]
    if "job_cgroup" in top:
        kw["job_cgroup_path"] = top["job_cgroup"]

    machine = Machine()
    thermal = F.check(top.get("thermal", {}), _THERMAL, where, prefix=("thermal",))
    if "zones" in thermal:
        kw["zone_max_c"] = thermal["zones"]
    if "guard_state" in thermal:
        machine = dataclasses.replace(machine, guard_state_path=thermal["guard_state"])
    rules = {k: thermal[k] for k in ("plausible_min_c", "plausible_max_c", "max_rate_c_per_s") if k in thermal}
    if rules:
        plaus = dataclasses.replace(
            Plausibility(),
            **{{"plausible_min_c": "min_c", "plausible_max_c": "max_c"}.get(k, k): v for k, v in rules.items()},
        )
        if not plaus.min_c < plaus.max_c:
            raise UserError(f"{where(('thermal',))}: [thermal] plausible_min_c must be below plausible_max_c")
        kw["plausibility"] = plaus
    if "root" in top:
        machine = dataclasses.replace(machine, root=Path(top["root"]))
    if root is not None:
        machine = dataclasses.replace(machine, root=root)
    kw["machine"] = machine

    queue = F.check(top.get("queue", {}), _QUEUE, where, prefix=("queue",))
    if "path" in queue:
        queue["path"] = Path(queue["path"])
    if "credentials" in queue:
        queue["credentials"] = Path(queue["credentials"])
    if url_has_userinfo(queue.get("url", "")):
        raise UserError(
            f"{where(('queue', 'url'))}: queue.url must not hold credentials (user:password@ or token@): every user "
            "can read this file, a job included",
            hint="put them in /etc/eran-grid/queue-credentials (root, mode 0600; docs/eran-grid.md, "
            '"Queue credentials") and remove them from queue.url',
        )
    kw["queue"] = QueueConfig(**queue)
    return Config(**kw)


def load(path: Path | str = DEFAULT_CONFIG, root: Path | None = None) -> Config:
    path = Path(path)
    if not path.exists():
        raise UserError(f"no configuration at {path}", hint=f"try: --config FILE, or create {path}")
    layers = load_layers(path, dropins=False)
    return from_mapping(layers.data, str(path), root=root, where=layers.locate)
