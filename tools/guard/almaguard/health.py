"""The health watchdog's checks: storm, memory, gpu, thermal, links, watchdog, disk, ota_cert.

Each check reads the machine (through :class:`Paths`), returns a :class:`Check`, and takes
no action. State between runs (counter snapshots for rates, the kernel-log cursor) lives
under /var/lib/alma-health. A check that fails to run reports UNKNOWN with the reason.
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from almaboard import fields as F
from almaboard import thermal, x509
from almaboard.config import load_layers
from almaboard.errors import BoardError
from almaboard.files import boot_id, boottime, iso, read_int, read_json, read_text, state_age, write_json
from almaboard.nagios import CODES, CRITICAL, OK, UNKNOWN, WARNING, Check, Perf, worst
from almaboard.paths import Paths

from . import kmsg
from .config import load_guard_config

SCHEMA = "alma.health/1"
CHECK_NAMES = ("storm", "memory", "gpu", "thermal", "links", "watchdog", "disk", "ota_cert")

HEALTH_DEFAULTS: dict[str, dict[str, Any]] = {
    "storm": {
        "mcast_warn": 1000.0,  # multicast packets/s on one interface (short window)
        "mcast_crit": 10000.0,
        "surge_ratio": 10.0,  # short-window rate this many times the long-window rate ...
        "mcast_surge_floor": 100.0,  # ... and at least this many multicast/s
        "rx_surge_floor": 50000.0,  # ... or this many rx packets/s
        "long_s": 900.0,
        "exclude": ["lo", "docker*", "veth*", "br-*", "virbr*"],
    },
    "memory": {"avail_warn_pct": 10.0, "avail_crit_pct": 5.0, "psi_some_warn": 20.0, "psi_full_crit": 10.0},
    "gpu": {"fatal_xids": [48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120]},
    "thermal": {"stale_s": 30.0, "crit_below_critical_trip_c": 5.0},
    "links": {"expected": {}, "fabric": "/etc/alma/fabric.toml"},
    "watchdog": {"required": False},
    "disk": {"paths": ["/"], "warn_pct": 10.0, "crit_pct": 5.0},
    # the image's OTA certificate (alma-ota's ota.json names it): WARNING this close to expiry
    "ota_cert": {"warn_days": float(x509.CERT_WARN_DAYS), "ota_json": "/etc/alma/ota.json"},
}

NVGPU_ERR = re.compile(r"nvgpu: \S+ .*\[ERR\]")
XID = re.compile(r"NVRM: Xid \((?P<dev>[^)]*)\): (?P<xid>\d+)")


_PCT = F.number(0.0, 100.0)
_RATE = F.number(0.0)
_NAME = F.string(max_len=256)
# Every key's type and range (almaboard.fields): a NaN threshold would never alert.
HEALTH_FIELDS: dict[str, F.Schema] = {
    "storm": {
        "mcast_warn": _RATE,
        "mcast_crit": _RATE,
        "surge_ratio": F.number(above=0.0),
        "mcast_surge_floor": _RATE,
        "rx_surge_floor": _RATE,
        "long_s": F.duration(above=0.0),
        "exclude": F.list_of(_NAME),
    },
    "memory": {"avail_warn_pct": _PCT, "avail_crit_pct": _PCT, "psi_some_warn": _PCT, "psi_full_crit": _PCT},
    "gpu": {"fatal_xids": F.list_of(F.integer(0, 1 << 16))},
    "thermal": {"stale_s": F.duration(above=0.0), "crit_below_critical_trip_c": F.number(0.0, 100.0)},
    # interface -> expected Mb/s (0: any speed)
    "links": {"expected": F.mapping(_NAME, F.integer(0, 10_000_000)), "fabric": F.string(max_len=4096)},
    "watchdog": {"required": F.boolean()},
    "disk": {"paths": F.list_of(F.string(max_len=4096)), "warn_pct": _PCT, "crit_pct": _PCT},
    "ota_cert": {"warn_days": F.number(0.0, 3650.0), "ota_json": F.string(r"/[^\x00]*", max_len=4096)},
}


def load_health_config(path: Path) -> dict[str, dict[str, Any]]:
    layers = load_layers(path)
    cfg = {k: dict(v) for k, v in HEALTH_DEFAULTS.items()}
    sections = F.check(layers.data, {name: F.table() for name in HEALTH_FIELDS}, layers.locate)
    for section, values in sections.items():
        cfg[section].update(F.check(values, HEALTH_FIELDS[section], layers.locate, prefix=(section,)))
    return cfg


@dataclass
class Context:
    paths: Paths
    cfg: dict[str, dict[str, Any]]
    now: float = field(default_factory=time.time)
    # CLOCK_BOOTTIME to judge the guard's state by; None = read the clock right after the
    # state file (a guard that writes while the other checks run is fresh, not "from the future").
    boottime: float | None = None
    save: bool = True
    state: dict[str, Any] = field(default_factory=dict)  # loaded from / saved to health_lib
    state_resets: dict[str, str] = field(default_factory=dict)  # key -> why it was reset (once)

    @property
    def state_file(self) -> Path:
        return self.paths.health_lib / "state.json"


# -- storm ------------------------------------------------------------------------------


def _net_counters(net: Path, exclude: list[str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    try:
        ifaces = sorted(p.name for p in net.iterdir())
    except OSError:
        return out
    for name in ifaces:
        if any(fnmatch.fnmatchcase(name, pat) for pat in exclude):
            continue
        stats = net / name / "statistics"
        mc, rx = read_int(stats / "multicast"), read_int(stats / "rx_packets")
        if mc is None and rx is None:
            continue
        out[name] = {"multicast": mc or 0, "rx_packets": rx or 0}
    return out


def _rate(new: dict[str, int], old: dict[str, int], key: str, dt: float) -> float | None:
    if dt <= 0 or key not in old:
        return None
    delta = new[key] - old[key]
    return None if delta < 0 else delta / dt  # a counter that went back: interface re-created


def check_storm(ctx: Context) -> Check:
    c = ctx.cfg["storm"]
    now_counters = _net_counters(ctx.paths.net, list(c["exclude"]))
    snaps: list[dict[str, Any]] = [s for s in ctx.state.get("snapshots", []) if isinstance(s, dict)]
    boot = boot_id(ctx.paths.boot_id_file)
    snaps = [s for s in snaps if s.get("boot_id") == boot and s.get("t", 0) < ctx.now]
    new_snaps = [*snaps, {"t": ctx.now, "boot_id": boot, "ifaces": now_counters}]
    ctx.state["snapshots"] = [s for s in new_snaps if ctx.now - s["t"] <= float(c["long_s"]) * 1.5][-64:]
    if not now_counters:
        return Check("storm", OK, "no network interfaces with statistics")
    if not snaps:
        return Check("storm", OK, f"baseline recorded for {len(now_counters)} interface(s); rates from the next run")
    short_ref = snaps[-1]
    long_ref = next((s for s in snaps if ctx.now - s["t"] <= float(c["long_s"])), snaps[-1])
    states, parts, perf = [], [], []
    for name, cur in now_counters.items():
        s_old = short_ref["ifaces"].get(name)
        l_old = long_ref["ifaces"].get(name)
        if not s_old:
            continue
        mc_s = _rate(cur, s_old, "multicast", ctx.now - short_ref["t"])
        rx_s = _rate(cur, s_old, "rx_packets", ctx.now - short_ref["t"])
        # The long window is the background before the short one (up to long_s back), so a
        # surge in the last interval does not raise its own baseline.
        base_dt = short_ref["t"] - long_ref["t"]
        mc_l = _rate(s_old, l_old, "multicast", base_dt) if l_old and base_dt > 0 else None
        rx_l = _rate(s_old, l_old, "rx_packets", base_dt) if l_old and base_dt > 0 else None
        if mc_s is None:
            parts.append(f"{name} counters reset")
            continue
        mc_l = mc_s if mc_l is None else mc_l
        rx_s = rx_s or 0.0
        rx_l = rx_s if rx_l is None else rx_l
        rate = Perf(f"{name}_mcast_rate", round(mc_s, 1), "", float(c["mcast_warn"]), float(c["mcast_crit"]), 0)
        st = rate.state()  # the thresholds published are the ones applied
        note = {CRITICAL: " STORM", WARNING: " high"}.get(st, "")
        if st == OK and mc_s >= float(c["mcast_surge_floor"]) and mc_s >= float(c["surge_ratio"]) * max(mc_l, 1.0):
            st, note = WARNING, " surge"
        elif st == OK and rx_s >= float(c["rx_surge_floor"]) and rx_s >= float(c["surge_ratio"]) * max(rx_l, 1.0):
            st, note = WARNING, " rx surge"
        states.append(st)
        if st != OK or len(now_counters) <= 4:
            parts.append(
                f"{name} multicast {mc_s:.0f}/s (short) {mc_l:.0f}/s (long), rx {rx_s:.0f}/s (short) {rx_l:.0f}/s"
                f" (long){note}"
            )
        perf.append(rate)
        perf.append(Perf(f"{name}_rx_rate", round(rx_s, 1), "", None, None, 0))
    status = worst(states) if states else OK
    if not parts:
        parts.append(f"{len(now_counters)} interface(s) quiet")
    return Check("storm", status, "; ".join(parts), perf)


# -- memory -----------------------------------------------------------------------------


def _meminfo(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (read_text(path) or "").splitlines():
        key, _, rest = line.partition(":")
        val = rest.split()
        if val and val[0].isdigit():
            out[key.strip()] = int(val[0])
    return out


def _psi(path: Path) -> dict[str, float] | None:
    text = read_text(path)
    if text is None:
        return None
    out: dict[str, float] = {}
    for line in text.splitlines():
        kind, *fields = line.split()
        for f in fields:
            k, _, v = f.partition("=")
            if k == "avg10":
                out[kind] = float(v)
    return out


def check_memory(ctx: Context) -> Check:
    c = ctx.cfg["memory"]
    mem = _meminfo(ctx.paths("/proc/meminfo"))
    if "MemTotal" not in mem or "MemAvailable" not in mem:
        return Check("memory", UNKNOWN, f"cannot read MemTotal/MemAvailable from {ctx.paths('/proc/meminfo')}")
    pct = 100.0 * mem["MemAvailable"] / max(mem["MemTotal"], 1)
    avail_mib = mem["MemAvailable"] / 1024
    avail = _free_pct_perf("mem_available_pct", pct, c["avail_warn_pct"], c["avail_crit_pct"])
    st = avail.state()
    # CPU and GPU share this pool on Orin: MemAvailable is the capacity, no "GPU free" figure.
    parts = [f"MemAvailable {avail_mib:.0f} MiB ({pct:.1f}% of {mem['MemTotal'] / 1024:.0f} MiB, shared CPU+GPU)"]
    perf = [avail]
    psi = _psi(ctx.paths("/proc/pressure/memory"))
    if psi is None:
        parts.append("PSI not available")
    else:
        some, full = psi.get("some", 0.0), psi.get("full", 0.0)
        p_some = Perf("psi_some_avg10", some, "%", float(c["psi_some_warn"]), None, 0, 100)
        p_full = Perf("psi_full_avg10", full, "%", None, float(c["psi_full_crit"]), 0, 100)
        st = worst([st, p_some.state(), p_full.state()])
        parts.append(f"PSI some {some:.1f}% full {full:.1f}% (avg10)")
        perf += [p_some, p_full]
    return Check("memory", st, ", ".join(parts), perf)


# -- gpu --------------------------------------------------------------------------------


def check_gpu(ctx: Context) -> Check:
    c = ctx.cfg["gpu"]
    src = ctx.paths.kmsg
    boot = boot_id(ctx.paths.boot_id_file)
    cur = ctx.state.get("kmsg") or {}
    cursor = cur.get("seq") if cur.get("boot_id") == boot else None
    try:
        records, new_cursor = kmsg.since(src, cursor, ("nvgpu", "NVRM"))
    except FileNotFoundError:
        return Check("gpu", UNKNOWN, f"no kernel log at {src}")
    except PermissionError:
        return Check(
            "gpu", UNKNOWN, f"cannot read {src}: needs root or CAP_SYSLOG (run as root or via alma-health.service)"
        )
    ctx.state["kmsg"] = {"boot_id": boot, "seq": new_cursor}
    nvgpu = [r for r in records if NVGPU_ERR.search(r.text)]
    xids = [(r, m) for r in records if (m := XID.search(r.text))]
    fatal = {int(x) for x in c["fatal_xids"]}
    fatal_hits = [m for _r, m in xids if int(m["xid"]) in fatal]
    st = OK
    if fatal_hits:
        st = CRITICAL
    elif nvgpu or xids:
        st = WARNING
    window = "since the last run" if cursor is not None else "this boot"
    if st == OK:
        summary = f"no nvgpu errors or Xid events {window}"
    else:
        parts = []
        if nvgpu:
            parts.append(f"{len(nvgpu)} nvgpu error line(s), last: {nvgpu[-1].text[:120]}")
        if xids:
            codes = ", ".join(sorted({m["xid"] for _r, m in xids}, key=int))
            parts.append(f"{len(xids)} NVRM Xid event(s) (Xid {codes}{', fatal' if fatal_hits else ''})")
        summary = f"{'; '.join(parts)} {window}"
    # Any error line or Xid warns (count above 0); a fatal Xid is CRITICAL by code, not by count.
    perf = [Perf("gpu_nvgpu_errors", len(nvgpu), "", 0, None, 0), Perf("gpu_xid_events", len(xids), "", 0, None, 0)]
    return Check("gpu", st, summary, perf)


# -- thermal ----------------------------------------------------------------------------


def check_thermal(ctx: Context) -> Check:
    c = ctx.cfg["thermal"]
    zones = thermal.discover(ctx.paths.thermal)
    try:  # the guard's own plausibility rules, so both judge a reading alike
        rules = load_guard_config(ctx.paths.etc_alma / "guard.toml").plausibility
    except BoardError:
        rules = thermal.Plausibility()
    reader = thermal.Reader(zones, rules)
    # One read: only the range and parse rules apply (no previous reading to judge a jump by).
    temps = {name: r.celsius for name, r in reader.read(time.monotonic()).items()}
    reader.close()
    st = OK
    parts: list[str] = []
    perf: list[Perf] = []
    readable = {n: t for n, t in temps.items() if t is not None}
    for z in zones:
        t = temps.get(z.name)
        if t is None:
            continue
        trip = z.critical_trip_c
        # CRITICAL this close to the trip; a temperature never WARNs by itself here (the
        # guard's shedding does, below), so no warn threshold is published.
        limit = None if trip is None else trip - float(c["crit_below_critical_trip_c"])
        temp = Perf(f"temp_{z.name}", round(t, 1), "", None, limit, None, None)
        perf.append(temp)
        if temp.state() == CRITICAL and trip is not None:
            st = worst([st, CRITICAL])
            parts.append(
                f"{z.name} {t:.1f} C within {c['crit_below_critical_trip_c']} C of the critical trip {trip:.1f} C"
            )
    if readable:
        hot_n, hot_t = max(readable.items(), key=lambda kv: kv[1])
        parts.insert(0, f"hottest {hot_n} {hot_t:.1f} C")
    elif zones:
        st = worst([st, UNKNOWN])
        parts.append("no zone readable")
    else:
        st = worst([st, UNKNOWN])
        parts.append("no thermal zones")
    # The guard's view.
    state = read_json(ctx.paths.guard_state)
    if not isinstance(state, dict) or state.get("schema") != "alma.guard-state/1":
        st = worst([st, UNKNOWN])
        parts.append(f"no guard state at {ctx.paths.guard_state}: is alma-guard running?")
    else:
        # On CLOCK_BOOTTIME (boot_id + boottime in the file): a wall-clock step either way
        # neither makes a dead guard look alive nor a live one look dead.
        now_bt = boottime() if ctx.boottime is None else ctx.boottime
        age = state_age(state, wall=ctx.now, boot=boot_id(ctx.paths.boot_id_file), now_boottime=now_bt)
        if age == float("inf"):
            st = worst([st, UNKNOWN])
            parts.append(
                "guard state cannot be fresh (another boot's, or dated in the future: the clock jumped?):"
                " the guard may be dead"
            )
        elif age > float(c["stale_s"]):
            st = worst([st, UNKNOWN])
            parts.append(f"guard state is stale ({age:.0f} s old > {c['stale_s']:.0f} s): the guard may be dead")
        elif state.get("shedding"):
            st = worst([st, WARNING])
            parts.append(f"guard SHEDDING since {state.get('since')}: {state.get('reason')}")
        else:
            parts.append("guard not shedding")
        fresh = age <= float(c["stale_s"])
        unreadable = [str(x) for x in state.get("unreadable", [])] if isinstance(state.get("unreadable"), list) else []
        if unreadable and fresh:
            st = worst([st, WARNING])
            parts.append(f"guard cannot read: {', '.join(unreadable[:20])}")
        stuck = [str(x) for x in state.get("stuck", [])] if isinstance(state.get("stuck"), list) else []
        if stuck and fresh:
            st = worst([st, WARNING])
            parts.append(f"sensor(s) stuck on one value: {', '.join(stuck[:20])}")
        errors = [str(x) for x in state.get("errors", [])] if isinstance(state.get("errors"), list) else []
        if errors and fresh:
            st = worst([st, WARNING])
            parts.append(f"guard errors: {'; '.join(errors[:5])}")
    return Check("thermal", st, "; ".join(parts), perf)


# -- links ------------------------------------------------------------------------------


def _expected_links(ctx: Context) -> tuple[dict[str, int | None], str]:
    c = ctx.cfg["links"]
    expected: dict[str, int | None] = {}
    source = []
    fpath = ctx.paths(str(c["fabric"])) if str(c["fabric"]).startswith("/") else Path(str(c["fabric"]))
    if fpath.is_file():
        from . import fabric as fabric_mod  # ipaddress etc. only when there is a fabric

        fab = fabric_mod.load(fpath)
        node = fabric_mod.node_name(ctx.paths("/etc/hostname"))
        expected.update(fab.expected_speeds(node))
        source.append(f"{fpath.name} node {node}")
    for name, speed in dict(c["expected"]).items():
        expected[str(name)] = int(speed) if speed else None
    if c["expected"]:
        source.append("health.toml")
    return expected, " + ".join(source)


def check_links(ctx: Context) -> Check:
    expected, source = _expected_links(ctx)
    if not expected:
        return Check("links", OK, "no fabric links configured (fabric.toml has no link for this node)")
    states, parts, perf = [], [], []
    for name, want in sorted(expected.items()):
        d = ctx.paths.net / name
        if not d.exists():
            states.append(CRITICAL)
            parts.append(
                f"{name} absent (a NIC that lost link can power down and leave the bus; check the cable and slot)"
            )
            continue
        oper = read_text(d / "operstate") or "unknown"
        carrier = read_text(d / "carrier")  # EINVAL (None here) while the interface is down
        speed = read_int(d / "speed")
        if carrier != "1":
            states.append(CRITICAL)
            why = "administratively down" if carrier is None else "no carrier"
            parts.append(f"{name} {why} (operstate {oper})")
            continue
        if speed is None or speed <= 0:
            states.append(WARNING)
            parts.append(f"{name} up, negotiated speed unknown")
            continue
        perf.append(Perf(f"{name}_speed", speed, "", None, None, 0, want))
        if want and speed < want:
            states.append(WARNING)
            parts.append(f"{name} up at {speed} Mb/s, expected {want} Mb/s")
        else:
            states.append(OK)
            parts.append(f"{name} up at {speed} Mb/s")
    return Check("links", worst(states), "; ".join(parts) + (f" [{source}]" if source else ""), perf)


# -- watchdog ---------------------------------------------------------------------------


def check_watchdog(ctx: Context) -> Check:
    c = ctx.cfg["watchdog"]
    devs = sorted(ctx.paths.watchdog.glob("watchdog*")) if ctx.paths.watchdog.is_dir() else []
    if not devs:
        msg = (
            f"no hardware watchdog device ({ctx.paths.watchdog} is empty); systemd's RuntimeWatchdogSec has "
            "nothing to arm. Stock L4T R36 disables the Tegra watchdog in the device tree."
        )
        return Check("watchdog", CRITICAL if c["required"] else OK, msg)
    parts, perf, st = [], [], OK
    for d in devs:
        ident = read_text(d / "identity") or "?"
        timeout = read_int(d / "timeout")
        state = read_text(d / "state")
        desc = f"/dev/{d.name} ({ident})"
        desc += f" timeout {timeout} s" if timeout is not None else " timeout unknown"
        if state is not None:
            desc += f", {state}"
            if state != "active":
                st = worst([st, WARNING])
                desc += " (not armed: is RuntimeWatchdogSec in effect?)"
        parts.append(desc)
        if timeout is not None:
            perf.append(Perf(f"{d.name}_timeout", timeout, "s", None, None, 0))
    return Check("watchdog", st, "; ".join(parts), perf)


# -- disk -------------------------------------------------------------------------------


def check_disk(ctx: Context) -> Check:
    c = ctx.cfg["disk"]
    states, parts, perf = [], [], []
    for mount in c["paths"]:
        p = ctx.paths(str(mount))
        try:
            sv = os.statvfs(p)
        except OSError as exc:
            states.append(UNKNOWN)
            parts.append(f"{mount}: {exc.strerror}")
            continue
        total = sv.f_blocks * sv.f_frsize
        free = sv.f_bavail * sv.f_frsize
        pct = 100.0 * free / total if total else 0.0
        label = "root" if mount == "/" else str(mount).strip("/").replace("/", "_")
        free_pct = _free_pct_perf(f"disk_{label}_free_pct", pct, c["warn_pct"], c["crit_pct"])
        states.append(free_pct.state())
        parts.append(f"{mount} {free / 2**30:.1f} GiB free ({pct:.1f}%)")
        perf.append(free_pct)
    return Check("disk", worst(states) if states else OK, "; ".join(parts) or "no paths configured", perf)


# -- ota_cert ---------------------------------------------------------------------------


def check_ota_cert(ctx: Context) -> Check:
    """The OTA signing certificate baked into the image: once expired, SWUpdate refuses every
    .swu, the one that would rotate it too (docs/ota.md, "Certificate lifetime")."""
    c = ctx.cfg["ota_cert"]
    path = ctx.paths(str(c["ota_json"]))
    if not path.exists():
        return Check("ota_cert", OK, "no OTA agent config (image without the ota feature)")
    cfg = read_json(path)
    if not isinstance(cfg, dict):
        return Check("ota_cert", UNKNOWN, f"{c['ota_json']} is not a JSON object")
    name = cfg.get("cert")
    if not isinstance(name, str) or not name.startswith("/"):
        return Check("ota_cert", UNKNOWN, f"{c['ota_json']} names no certificate path")
    try:
        with ctx.paths(name).open("rb") as f:
            data = f.read(x509.MAX_CERT + 1)
    except OSError as exc:
        return Check("ota_cert", CRITICAL, f"{name}: {exc.strerror}: this board can verify no update")
    try:
        _start, end = x509.validity(data)
    except ValueError as exc:
        return Check("ota_cert", UNKNOWN, f"{name}: cannot read its expiry ({exc})")
    days = (end.timestamp() - ctx.now) / 86400.0
    warn = float(c["warn_days"])
    perf = [Perf("ota_cert_days_left", round(days, 1), "", warn, 0.0, low=True)]
    when = f"{end:%Y-%m-%d %H:%M} UTC"
    if days <= 0:
        return Check("ota_cert", CRITICAL, f"OTA certificate expired on {when}: SWUpdate refuses every .swu "
                                           "(reflash with a new certificate: docs/ota.md)", perf)  # fmt: skip
    if days < warn:
        return Check("ota_cert", WARNING, f"OTA certificate expires on {when} (in {int(days)} days, under "
                                          f"{warn:g}): ship its successor now (docs/ota.md)", perf)  # fmt: skip
    return Check("ota_cert", OK, f"OTA certificate valid until {when} ({int(days)} days)", perf)


def _free_pct_perf(label: str, pct: float, warn: Any, crit: Any) -> Perf:
    """Perfdata for a "% still free" figure: 0..100, lower is worse."""
    return Perf(label, round(pct, 1), "%", float(warn), float(crit), 0, 100, low=True)


CHECKS: dict[str, Callable[[Context], Check]] = {
    "storm": check_storm,
    "memory": check_memory,
    "gpu": check_gpu,
    "thermal": check_thermal,
    "links": check_links,
    "watchdog": check_watchdog,
    "disk": check_disk,
    "ota_cert": check_ota_cert,
}


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _snapshot_ok(s: Any) -> bool:
    return (
        isinstance(s, dict)
        and _num(s.get("t"))
        and isinstance(s.get("boot_id"), str)
        and isinstance(s.get("ifaces"), dict)
        and all(
            isinstance(k, str) and isinstance(v, dict) and all(isinstance(c, str) and _num(n) for c, n in v.items())
            for k, v in s["ifaces"].items()
        )
    )


def load_state(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """alma-health's own state through one typed loader: each key of the wrong shape is reset
    (and the reset reported once, by the check that owns it) instead of failing the check
    on every run forever. Returns the state and ``{key: why}`` for what was reset."""
    loaded = read_json(path, limit=1 << 20)
    resets: dict[str, str] = {}
    if loaded is None:
        if path.exists():
            resets["snapshots"] = resets["kmsg"] = f"{path} unreadable or not JSON"
        return {}, resets
    if not isinstance(loaded, dict):
        return {}, {"snapshots": f"{path} is not a JSON object", "kmsg": f"{path} is not a JSON object"}
    state: dict[str, Any] = {}
    snaps = loaded.get("snapshots", [])
    if isinstance(snaps, list) and all(_snapshot_ok(x) for x in snaps):
        state["snapshots"] = snaps
    else:
        resets["snapshots"] = "snapshots of the wrong type"
    cur = loaded.get("kmsg", {})
    if isinstance(cur, dict) and (
        not cur
        or (
            isinstance(cur.get("boot_id"), str)
            and (cur.get("seq") is None or (isinstance(cur.get("seq"), int) and not isinstance(cur.get("seq"), bool)))
        )
    ):
        state["kmsg"] = cur
    else:
        resets["kmsg"] = "kmsg cursor of the wrong type"
    return state, resets


_RESET_OWNER = {"snapshots": "storm", "kmsg": "gpu"}


def run_checks(ctx: Context, only: list[str] | None = None) -> list[Check]:
    """Run the checks; state is loaded first and saved after (when ``ctx.save``)."""
    ctx.state, ctx.state_resets = load_state(ctx.state_file)
    results = []
    for name in only or list(CHECK_NAMES):
        try:
            check = CHECKS[name](ctx)
            for key, why in ctx.state_resets.items():
                if _RESET_OWNER[key] == name:
                    check.status = worst([check.status, WARNING])
                    check.summary += f" (own state reset: {why}; {ctx.state_file} rewritten)"
            results.append(check)
        except BoardError as exc:
            results.append(Check(name, UNKNOWN, f"{exc.message}" + (f" (try: {exc.hint})" if exc.hint else "")))
        except Exception as exc:
            results.append(Check(name, UNKNOWN, f"check failed: {type(exc).__name__}: {exc}"))
    if ctx.save:
        try:
            write_json(ctx.state_file, ctx.state, durable=False)
        except OSError as exc:
            # Read-only use (e.g. an unprivileged SSH user) still reports; say what was lost.
            for c in results:
                if c.name in ("storm", "gpu"):
                    c.summary += f" (state not saved: {ctx.state_file}: {exc.strerror})"
    return results


def report(checks: list[Check], node: str, now: float) -> dict[str, Any]:
    overall = worst([c.status for c in checks])
    return {
        "schema": SCHEMA,
        "node": node,
        "time": iso(now),
        "status": overall,
        "code": CODES[overall],
        "checks": [c.to_json() for c in checks],
    }


def hostname(paths: Paths) -> str:
    name = read_text(paths("/etc/hostname"))
    if not name:
        import socket  # only when /etc/hostname is missing

        name = socket.gethostname()
    return name.split(".")[0]
