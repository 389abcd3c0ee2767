"""Configuration: one TOML file, opt-in by ``enabled = true``, every machine path injectable."""

from __future__ import annotations

import dataclasses
import socket
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


_FLOATS = (
    "poll",
    "slow_poll",
    "idle_poll",
    "idle_after",
    "vacate_after",
    "grace",
    "heat_holdoff",
    "max_temp_c",
    "cpu_busy",
    "cpu_window",
    "lease_ttl",
    "guard_stale_after",
)
_INTS = (
    "max_failures",
    "checkpoint_max_bytes",
    "result_max_bytes",
    "stderr_max_bytes",
    "job_disk_max_bytes",
    "job_disk_max_inodes",
)
_BOOLS = ("enabled", "include_serial_ttys", "require_guard")


def _typed(key: str, value: Any, want: type | tuple[type, ...], source: str) -> Any:
    if isinstance(value, bool) and want is not bool:
        raise UserError(f"{source}: `{key}` must be a number, not {value!r}")
    if not isinstance(value, want):
        raise UserError(
            f"{source}: `{key}` has the wrong type ({type(value).__name__})", hint=f"see docs/eran-grid.md for `{key}`"
        )
    return value


def from_mapping(data: dict[str, Any], source: str = "config", root: Path | None = None) -> Config:
    """Build a Config from parsed TOML. Unknown keys are errors: a typo must not silently
    leave a safety limit at its default."""
    data = dict(data)
    kw: dict[str, Any] = {}
    for key in _FLOATS:
        if key in data:
            kw[key] = float(_typed(key, data.pop(key), (int, float), source))
            if kw[key] < 0:
                raise UserError(f"{source}: `{key}` must not be negative")
    for key in _INTS:
        if key in data:
            kw[key] = _typed(key, data.pop(key), int, source)
    for key in _BOOLS:
        if key in data:
            kw[key] = _typed(key, data.pop(key), bool, source)
    if "node" in data:
        node = _typed("node", data.pop("node"), str, source)
        if node:
            kw["node"] = node
    for key in ("state_dir", "status_path"):
        if key in data:
            kw[key] = Path(_typed(key, data.pop(key), str, source))
    if "job_user" in data:
        kw["job_user"] = _typed("job_user", data.pop("job_user"), str, source)
    if "job_cgroup" in data:
        kw["job_cgroup_path"] = _typed("job_cgroup", data.pop("job_cgroup"), str, source)
    if "poll" in kw and not 0.01 <= kw["poll"] <= 5:
        raise UserError(f"{source}: `poll` must be between 0.01 and 5 seconds")

    machine = Machine()
    thermal = data.pop("thermal", {})
    if thermal:
        thermal = dict(_typed("thermal", thermal, dict, source))
        zones = thermal.pop("zones", {})
        kw["zone_max_c"] = {
            str(k): float(_typed(f"thermal.zones.{k}", v, (int, float), source)) for k, v in dict(zones).items()
        }
        if "guard_state" in thermal:
            machine = dataclasses.replace(
                machine, guard_state_path=_typed("thermal.guard_state", thermal.pop("guard_state"), str, source)
            )
        rules = {
            key: float(_typed(f"thermal.{key}", thermal.pop(key), (int, float), source))
            for key in ("plausible_min_c", "plausible_max_c", "max_rate_c_per_s")
            if key in thermal
        }
        if rules:
            plaus = dataclasses.replace(
                Plausibility(),
                **{{"plausible_min_c": "min_c", "plausible_max_c": "max_c"}.get(k, k): v for k, v in rules.items()},
            )
            if not plaus.min_c < plaus.max_c or plaus.max_rate_c_per_s <= 0:
                raise UserError(
                    f"{source}: [thermal] plausible_min_c must be below plausible_max_c, max_rate_c_per_s > 0"
                )
            kw["plausibility"] = plaus
        if thermal:
            raise UserError(f"{source}: unknown key(s) in [thermal]: {', '.join(sorted(thermal))}")
    if "root" in data:
        machine = dataclasses.replace(machine, root=Path(_typed("root", data.pop("root"), str, source)))
    if root is not None:
        machine = dataclasses.replace(machine, root=root)
    kw["machine"] = machine

    queue = dict(_typed("queue", data.pop("queue", {}), dict, source))
    qkw: dict[str, Any] = {}
    if "backend" in queue:
        qkw["backend"] = _typed("queue.backend", queue.pop("backend"), str, source)
        if qkw["backend"] not in ("sqlite", "nats"):
            raise UserError(f'{source}: queue.backend must be "sqlite" or "nats", not {qkw["backend"]!r}')
    if "path" in queue:
        qkw["path"] = Path(_typed("queue.path", queue.pop("path"), str, source))
    for key in ("url", "stream"):
        if key in queue:
            qkw[key] = _typed(f"queue.{key}", queue.pop(key), str, source)
    if url_has_userinfo(qkw.get("url", "")):
        raise UserError(
            f"{source}: queue.url must not hold credentials (user:password@ or token@): every user can read "
            "this file, a job included",
            hint="put them in /etc/eran-grid/queue-credentials (root, mode 0600; docs/eran-grid.md, "
            '"Queue credentials") and remove them from queue.url',
        )
    if "credentials" in queue:
        qkw["credentials"] = Path(_typed("queue.credentials", queue.pop("credentials"), str, source))
    if "connect_timeout" in queue:
        qkw["connect_timeout"] = float(
            _typed("queue.connect_timeout", queue.pop("connect_timeout"), (int, float), source)
        )
    if queue:
        raise UserError(f"{source}: unknown key(s) in [queue]: {', '.join(sorted(queue))}")
    kw["queue"] = QueueConfig(**qkw)
    if data:
        raise UserError(
            f"{source}: unknown key(s): {', '.join(sorted(data))}",
            hint="see docs/eran-grid.md for the configuration keys",
        )
    return Config(**kw)


def load(path: Path = DEFAULT_CONFIG, root: Path | None = None) -> Config:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise UserError(f"no configuration at {path}", hint=f"try: --config FILE, or create {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML: {exc}", hint="fix the file; see docs/eran-grid.md") from None
    except RecursionError:  # `a = [[[[...`: a few hundred levels exhaust tomllib's recursion
        raise UserError(
            f"{path}: not valid TOML: nested too deeply", hint="fix the file; see docs/eran-grid.md"
        ) from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    return from_mapping(data, str(path), root=root)
