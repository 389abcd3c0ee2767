"""alma-ota: the board's side of an A/B update (docs/ota.md). Stdlib only.

The host (``alma update``) calls one subcommand per step over ssh; each prints one JSON
object on stdout and exits 0, or prints ``{"error": ...}`` and exits with a documented code:
2 usage/refused input, 3 busy (another run holds the board), 4 the step failed.

Invariants (each tested in tests/update):

- The running slot is never written: the target is always the other slot, asked from
  ``nvbootctrl -t rootfs get-current-slot`` at the moment of the install.
- The boot slot is switched only after SWUpdate reported success AND the slot reads back
  with the signed sha256 (SWUpdate 2022.12's own exit code races with its child process:
  seen exit 1 after "SWUPDATE successful"). A power loss before the switch boots the old
  slot, unchanged.
- A new slot is never marked successful by this agent except on ``commit``, which the host
  sends only after health passed, or by ``settle`` when it judges a hawkBit install (``claim``
  and ``adopt``, SWUpdate's hooks) healthy on the new slot after a fresh boot; an uncommitted
  slot is retried by the bootloader at most its retry count, then the bootloader falls back
  (meta-tegra's redundant boot).
- The capsule is armed only when its version differs from the running bootloader's and is
  not below the lowest supported version (a blocked downgrade would leave a broken update).
- One run at a time: ``begin`` creates the lock file with O_EXCL in the persistent state
  dir; every later step names its run and is refused for another run.

Paths come from ``--root`` (or ``$ALMA_OTA_ROOT``): ``<root>/etc/alma/ota.json`` (written at
image time: machine, hw revision, cert, state dir, lowest bootloader), ``<root>/etc/alma-release``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from almaboard import fields as F
from almaboard.errors import BoardError, UserError, run_main
from almaboard.files import boot_id, iso, parse_iso, read_json, write_atomic, write_json

# Imported where a step needs them, not at every start: each call from the desktop (one per
# phase, a status every poll) is a Python start, and the .swu reader, hashing and temporary
# dirs serve only receive and install (measured on a virtual board: half the agent's imports).
if TYPE_CHECKING:
    from almaboard import swu as board_swu

PROG = "alma-ota"
VERSION = "0.1.0"
SLOT_NAMES = ("a", "b")
ESP_CAPSULE = "boot/efi/EFI/UpdateCapsule/TEGRA_BL.Cap"
_RUN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# The board's identity as the flash-time hook writes /etc/hostname (an RFC 1123 label): its
# hawkBit device id. Words handed to SWUpdate's launcher (word-split by sh) stay in _WORD.
_WORD = re.compile(r"^[A-Za-z0-9._,:/+-]{1,4096}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_SLOT_LINE = re.compile(r"^slot:\s*(\d+),\s*(?:retry_count:\s*(\d+),\s*)?status:\s*(\w+)", re.MULTILINE)
TOOL_TIMEOUT_S = 600
LEASE_S = 3600.0  # a run's lock lapses this long after its last step (ota.json: lease_s)
VERIFY_S = 1800.0  # an uncommitted new slot may run this long unjudged (ota.json: verify_s)
# A hawkBit install is judged by the board itself: healthy within this long after its first
# boot on the new slot, or rolled back (ota.json: health_s; settle judges at boot and by timer).
HEALTH_S = 900.0
# The SWUpdate daemon polling hawkBit is one run on the board, under this run id: its
# preupdatecmd (``claim``) takes the lease, its postupdatecmd (``adopt``) takes the install.
DAEMON_RUN = "hawkbit"
DAEMON_SWU = "hawkbit.swu"  # the daemon's copy of the .swu it installs (swupdate -o)
# Set for the SWUpdate that ``install`` runs: it reads the image's /etc/swupdate.cfg as well
# (SWUpdate's default config file) and so runs its pre/post-update hooks, which belong to the
# daemon; the ssh run's own steps switch and judge that install.
IN_INSTALL = "ALMA_OTA_INSTALL"
MAX_SWU = 16 << 30


class Busy(BoardError):
    exit_code = 3


class StepFailed(BoardError):
    exit_code = 4


def vtuple(text: str) -> tuple[int, ...]:
    from almaboard.swu import version_tuple

    return version_tuple(text)


_PATH = F.string(r"/?[^\x00]+", max_len=4096, what="a path")
_TOOL = F.string(r"[^\x00\s]+", max_len=4096, what="a program name or path")
# ota.json, written at image time (recipe alma-ota): every key typed, unknown keys refused.
CONFIG_FIELDS: F.Schema = {
    "machine": F.string(r"[A-Za-z0-9][A-Za-z0-9._+-]*", max_len=128, what="a MACHINE name"),
    "hw_revision": F.string(r"[A-Za-z0-9][A-Za-z0-9._-]*", max_len=64, what="a hardware revision"),
    "cert": _PATH,
    "state_dir": _PATH,
    "lowest_bootloader": F.string(r"([0-9]+(\.[0-9]+)*)?", max_len=64, what="a version (36.4.0) or empty"),
    "install_lock": _PATH,
    "nvbootctrl": _TOOL,
    "systemctl": _TOOL,
    "swupdate": _TOOL,
    "set_osindications": _TOOL,
    "reboot": _TOOL,
    "health": _TOOL,
    "health_s": F.duration(),
}


class Board:
    def __init__(self, root: Path) -> None:
        self.root = root
        path = root / "etc/alma/ota.json"
        raw = read_json(path)
        if not isinstance(raw, dict):
            raise UserError(f"{path} is missing or not JSON: this image has no ota feature")
        cfg = F.check(raw, CONFIG_FIELDS, F.in_file(path), hint="the image writes ota.json (recipe alma-ota)")
        self.cfg = cfg
        self.state = root / str(cfg.get("state_dir", "data/alma-ota")).lstrip("/")
        self.state.mkdir(parents=True, exist_ok=True)
        self._tmp: Path | None = None

    # ---- tools ----------------------------------------------------------------------------

    def tool(
        self, *argv: str, check: bool = True, stdin: Any = subprocess.DEVNULL, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        try:
            r = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=TOOL_TIMEOUT_S,
                stdin=stdin,
                cwd=self.root,
                env={**os.environ, "TMPDIR": str(self.tmpdir()), **(env or {})},
            )
        except FileNotFoundError:
            raise StepFailed(f"{argv[0]} is not installed on this board (the ota feature ships it)") from None
        except subprocess.TimeoutExpired:
            raise StepFailed(f"{argv[0]} did not finish within {TOOL_TIMEOUT_S} s") from None
        if check and r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [""]
            raise StepFailed(f"{' '.join(argv[:3])} exited {r.returncode}: {tail[0]}")
        return r

    def tmpdir(self) -> Path:
        """SWUpdate's TMPDIR (its sockets live there: a short path, < 108 bytes; private, 0700)."""
        if self._tmp is None:
            import tempfile

            self._tmp = Path(tempfile.mkdtemp(prefix="alma-ota-"))
        return self._tmp

    def nvbootctrl(self, target: str, *args: str) -> str:
        return self.tool(str(self.cfg.get("nvbootctrl", "nvbootctrl")), "-t", target, *args).stdout

    def current_slot(self, dump: str | None = None) -> str:
        """The running slot: from ``dump`` (``-t rootfs dump-slots-info``'s "Current rootfs
        slot" line, which ``status`` reads anyway) or else asked from ``get-current-slot``."""
        named = re.search(r"^Current rootfs slot:\s*([AB])\s*$", dump or "", re.MULTILINE)
        if named:
            return SLOT_NAMES["AB".index(named.group(1))]
        out = self.nvbootctrl("rootfs", "get-current-slot").strip()
        if out not in ("0", "1"):
            raise StepFailed(f"could not identify the current boot slot (nvbootctrl said {out[:40]!r})")
        return SLOT_NAMES[int(out)]

    def slots(self, dump: str | None = None) -> dict[str, Any]:
        """Both slots' state; ``dump``: the rootfs ``dump-slots-info`` output, if already read."""
        text = self.nvbootctrl("rootfs", "dump-slots-info") if dump is None else dump
        active = re.search(r"^Active rootfs slot:\s*([AB])", text, re.MULTILINE)
        info: dict[str, Any] = {"active": active.group(1).lower() if active else None}
        for m in _SLOT_LINE.finditer(text):
            n = int(m.group(1))
            if n < 2:
                info[SLOT_NAMES[n]] = {"retry_count": int(m.group(2)) if m.group(2) else None, "status": m.group(3)}
        bl = self.nvbootctrl("bootloader", "dump-slots-info")
        ver = re.search(r"^Current version:\s*([0-9.]+)", bl, re.MULTILINE)
        cap = re.search(r"^Capsule update status:\s*(\d+)", bl, re.MULTILINE)
        info["bootloader_version"] = ver.group(1) if ver else None
        info["capsule_status"] = int(cap.group(1)) if cap else None
        return info

    # ---- lock -------------------------------------------------------------------------------

    @property
    def lock_path(self) -> Path:
        return self.state / "lock.json"

    def lock(self) -> dict[str, Any] | None:
        got = read_json(self.lock_path)
        return got if isinstance(got, dict) else None

    @property
    def lease_s(self) -> float:
        v = self.cfg.get("lease_s", LEASE_S)
        return float(v) if isinstance(v, (int, float)) and v > 0 else LEASE_S

    def lease(self, run: str, host: str, since: str | None = None) -> dict[str, Any]:
        """A lock record: held until ``expires`` unless its run renews it (every step does)."""
        now = time.time()
        return {"run": run, "host": host, "since": since or iso(now), "expires": iso(now + self.lease_s)}

    def require(self, run: str) -> dict[str, Any]:
        held = self.lock()
        if held is None:
            raise UserError(f"no update run holds this board (expected {run})")
        if held.get("run") != run:
            raise Busy(_busy(held))
        held = self.lease(run, str(held.get("host", "")), str(held.get("since") or "") or None)
        write_json(self.lock_path, held)  # renewed: the run is alive
        return held

    def release(self, run: str) -> bool:
        """Drop ``run``'s lock; False when ``run`` held nothing (no lock, or another run's)."""
        held = self.lock()
        if held is not None and held.get("run") == run:
            self.lock_path.unlink()
            return True
        return False

    def boot_id(self) -> str:
        return boot_id(self.root / "proc/sys/kernel/random/boot_id")

    def forget(self, result: str, why: str, pend: dict[str, Any] | None) -> None:
        """End the update on the board: pending and lock gone, the outcome kept in last.json."""
        write_json(
            self.state / "last.json", {"run": (pend or {}).get("run"), "result": result, "why": why, "at": iso()}
        )
        (self.state / "pending.json").unlink(missing_ok=True)
        _forget_incoming(self)
        self.lock_path.unlink(missing_ok=True)

    def pending(self) -> dict[str, Any] | None:
        got = read_json(self.state / "pending.json")
        return got if isinstance(got, dict) else None


def _expired(held: dict[str, Any]) -> bool:
    """A lease past its expiry (or a lock without a readable one, from an older agent)."""
    try:
        return parse_iso(str(held.get("expires"))) <= time.time()
    except ValueError:
        return True


def _busy(held: dict[str, Any]) -> str:
    return (
        f"board busy: update run {held.get('run')} from {held.get('host') or '?'} since {held.get('since')} "
        f"holds it (lease until {held.get('expires')})"
    )


def _run_id(text: str) -> str:
    if not _RUN.fullmatch(text):
        raise UserError(f"bad run id {text[:70]!r}")
    return text


def running_version(b: Board) -> str | None:
    """VERSION_ID of the running image (/etc/alma-release)."""
    rel = {}
    with contextlib.suppress(OSError):
        for ln in (b.root / "etc/alma-release").read_text().splitlines():
            k, _sep, v = ln.partition("=")
            rel[k.strip()] = v.strip().strip('"')
    return rel.get("VERSION_ID")


def cmd_status(b: Board, _: argparse.Namespace) -> dict[str, Any]:
    dump = b.nvbootctrl("rootfs", "dump-slots-info")  # one call for the current slot and both slots
    cur = b.current_slot(dump)
    guard = b.tool(str(b.cfg.get("systemctl", "systemctl")), "is-active", "alma-guard.service", check=False)
    return {
        "machine": b.cfg.get("machine"),
        "version": running_version(b),
        "current_slot": cur,
        "slots": b.slots(dump),
        "boot_id": b.boot_id(),
        "lock": b.lock(),
        "pending": b.pending(),
        "received": _received(b),
        "last": read_json(b.state / "last.json"),
        "guard": guard.stdout.strip() or "unknown",
    }


def _received(b: Board) -> dict[str, Any] | None:
    """How much of a push is on the board (the desktop resumes a cut push from there)."""
    held = b.lock()
    for name, done in (("incoming.swu", True), ("incoming.swu.part", False)):
        with contextlib.suppress(OSError):
            size = (b.state / name).stat().st_size
            return {"run": held.get("run") if held else None, "bytes": size, "complete": done}
    return None


def _gate_args(b: Board, target: str, *, allow_downgrade: bool) -> list[str]:
    """SWUpdate's gate, one list for ``install`` and the hawkBit daemon: the baked-in
    certificate (-k), this machine (-H), the target slot's set (-e), no older version (-N)."""
    machine, hwrev = str(b.cfg["machine"]), str(b.cfg.get("hw_revision", "1.0"))
    argv = ["-k", str(b.root / str(b.cfg["cert"]).lstrip("/")), "-H", f"{machine}:{hwrev}", "-e", f"alma,slot-{target}"]
    running = running_version(b)
    if running and not allow_downgrade:
        argv += ["-N", running]  # SWUpdate refuses a version older than the running one by itself
    return argv


def cmd_swupdate_args(b: Board, a: argparse.Namespace) -> dict[str, Any]:
    from almaboard.text import is_hostname

    """What meta-swupdate's launcher (swupdate.sh, sourcing /etc/swupdate/conf.d/50-alma-ota)
    passes to the SWUpdate daemon polling hawkBit: ``SWUPDATE_ARGS`` (config file, the gate,
    the inactive slot) or, with ``--suricatta``, ``SWUPDATE_SURICATTA_ARGS`` (the device id)."""
    if a.suricatta:
        path = b.root / "etc/hostname"
        try:
            name = path.read_text(errors="replace").strip()
        except OSError as exc:
            raise UserError(f"{path}: {exc.strerror}: this board has no identity to give hawkBit") from None
        if not is_hostname(name):
            raise UserError(f"{path} holds no board name (an RFC 1123 label): not polling hawkBit")
        words = ["-i", name]
    else:
        target = "b" if b.current_slot() == "a" else "a"  # never the running slot
        cfg = b.root / "etc/swupdate.cfg"
        words = (["-f", str(cfg)] if cfg.is_file() else []) + _gate_args(b, target, allow_downgrade=False)
        # The whole .swu kept where ``adopt`` reads it: the agent checks what was installed
        # with its own reader and reads the slot back against it (SWUpdate saves the stream,
        # then installs from that copy: core/stream_interface.c, save_stream).
        words += ["-o", str(b.state / DAEMON_SWU)]
    bad = [w for w in words if not _WORD.fullmatch(w)]
    if bad:
        raise UserError(f"cannot hand {bad[0][:80]!r} to SWUpdate's launcher (it splits words)")
    return {"words": words}


def cmd_begin(b: Board, a: argparse.Namespace) -> dict[str, Any]:
    run = _run_id(a.run)
    rec = b.lease(run, a.host)
    try:
        # Complete or absent, never empty: written and synced aside, then linked into place
        # (which fails like O_EXCL when a lock exists). A full disk leaves no lock at all.
        write_atomic(b.lock_path, (json.dumps(rec) + "\n").encode(), mode=0o600, exclusive=True)
    except FileExistsError:
        held = b.lock()
        if held is not None and held.get("run") == run:
            return {"lock": b.require(run), "resumed": True}
        if held is None:  # a torn lock file from a power loss while writing it: ours to take
            b.lock_path.unlink(missing_ok=True)
            return cmd_begin(b, a)
        if _expired(held) and b.pending() is None:  # its run died before installing: the lease frees it
            _forget_incoming(b)
            b.lock_path.unlink(missing_ok=True)
            return cmd_begin(b, a)
        raise Busy(_busy(held)) from None
    except OSError as exc:
        raise StepFailed(f"cannot write {b.lock_path}: {os.strerror(exc.errno or errno.EIO)}") from None
    return {"lock": rec, "resumed": False}


def _forget_incoming(b: Board) -> None:
    for name in ("incoming.swu.part", "incoming.swu", DAEMON_SWU):
        (b.state / name).unlink(missing_ok=True)


def cmd_receive(b: Board, a: argparse.Namespace) -> dict[str, Any]:
    b.require(_run_id(a.run))
    if not _HEX64.fullmatch(a.sha256) or not 0 < a.size <= MAX_SWU or not 0 <= a.offset < a.size:
        raise UserError("receive needs --sha256 (64 hex), --size (bytes) and an --offset below the size")
    part = b.state / "incoming.swu.part"
    import hashlib

    h = hashlib.sha256()
    n = 0
    if a.offset:  # resume a cut push: the bytes already here count toward the hash
        have = part.stat().st_size if part.is_file() else 0
        if have != a.offset:
            raise StepFailed(f"cannot resume at {a.offset}: the board holds {have} bytes of this push")
        with part.open("rb") as f:
            while c := f.read(1 << 20):
                h.update(c)
        n = a.offset
    with part.open("ab" if a.offset else "wb") as out:
        while n < a.size:
            chunk = sys.stdin.buffer.read(min(1 << 20, a.size - n))
            if not chunk:
                break
            h.update(chunk)
            out.write(chunk)
            n += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    if n != a.size:
        raise StepFailed(f"push cut short: {n} of {a.size} bytes arrived")
    if h.hexdigest() != a.sha256:
        part.unlink(missing_ok=True)
        raise StepFailed("the pushed file does not match its sha256")
    part.replace(b.state / "incoming.swu")
    return {"received": n, "sha256": a.sha256, "resumed_at": a.offset}


def _readback(device: Path, size: int) -> str:
    import hashlib

    h = hashlib.sha256()
    left = size
    with device.open("rb") as f:
        while left:
            c = f.read(min(1 << 20, left))
            if not c:
                break
            h.update(c)
            left -= len(c)
    return h.hexdigest()


def _read_swu(swu: Path) -> board_swu.Swu:
    """The received file through the one reader and allowlist the desktop uses (almaboard.swu:
    member names' grammar, no unlisted member, nothing written outside a slot)."""
    from almaboard import swu as board_swu

    try:
        return board_swu.read(swu, label="the received .swu")
    except board_swu.SwuRefused as exc:
        raise UserError(exc.message, hint=exc.hint) from None


def _read_for_board(b: Board, swu: Path) -> board_swu.Swu:
    """:func:`_read_swu`, and made for this board's machine."""
    got = _read_swu(swu)
    machine = str(b.cfg["machine"])
    if got.machine != machine:
        raise UserError(f"this .swu is for {got.machine}, this board is {machine}: refused")
    return got


def cmd_install(b: Board, a: argparse.Namespace) -> dict[str, Any]:
    run = _run_id(a.run)
    b.require(run)
    swu = b.state / "incoming.swu"
    if not swu.is_file():
        raise UserError("nothing received: push the .swu first")
    cur = b.current_slot()
    target = "b" if cur == "a" else "a"
    got = _read_for_board(b, swu)  # before SWUpdate: refuse what writes outside the slot, or rides along
    gate = _gate_args(b, target, allow_downgrade=a.allow_downgrade)
    argv = [str(b.cfg.get("swupdate", "swupdate")), *gate, "-i", str(swu)]
    lock_file = b.cfg.get("install_lock")
    with contextlib.ExitStack() as stack:
        if lock_file:  # a simulated host runs several boards' SWUpdate: its sockets are host-wide
            fh = stack.enter_context(open(str(lock_file), "w"))
            fcntl.flock(fh, fcntl.LOCK_EX)
        r = b.tool(*argv, check=False, env={IN_INSTALL: run})
    log = (r.stdout + r.stderr)[-20000:]
    (b.state / f"swupdate-{run}.log").write_text(log)
    failed = "SWUpdate *failed*" in log or "successful" not in log
    if failed:
        errors = [ln.split("ERROR :", 1)[-1].strip() for ln in log.splitlines() if "ERROR" in ln and "ERROR :" in ln]
        raise StepFailed("SWUpdate refused the update: " + ("; ".join(errors[:3]) or f"exit {r.returncode}"))
    out = _switch(b, run, got, cur, target, {})
    swu.unlink()
    return out


def _switch(b: Board, run: str, got: board_swu.Swu, cur: str, target: str, extra: dict[str, Any]) -> dict[str, Any]:
    """After SWUpdate wrote ``target``: read it back against the signed sha256, arm the capsule,
    switch the boot slot and record the pending update (with the boot it was installed in)."""
    sw = got.software
    out: dict[str, Any] = {"slot": target, "from": cur, "version": sw.get("version"), "capsule": None}
    for im in got.images[target]:
        if im["type"] == "raw":
            dev = b.root / str(im["device"]).lstrip("/")
            size = got.members[im["filename"]].size
            if _readback(dev, size) != im["sha256"]:
                raise StepFailed(f"slot {target} does not read back as the signed image: not switching")
        elif im["type"] == "rawfile":
            out["capsule"] = _arm_capsule(b, im, sw)
    b.nvbootctrl("rootfs", "set-active-boot-slot", str(SLOT_NAMES.index(target)))
    write_json(
        b.state / "pending.json",
        {"run": run, "slot": target, "from": cur, "version": sw.get("version"), "boot": b.boot_id(), **extra},
    )
    return out


def cmd_claim(b: Board, _: argparse.Namespace) -> dict[str, Any]:
    """SWUpdate's ``preupdatecmd`` on the daemon polling hawkBit (swupdate.cfg): runs once the
    signature and machine are checked, before any image is written. The daemon's install
    takes the board's lease as any run does: refused busy (SWUpdate then installs nothing)
    while an ``alma update`` run holds the board, and an ``alma update`` is refused while the
    daemon's install holds it. An update already installed and not yet judged refuses too."""
    pend = b.pending()
    try:
        if pend is not None:
            raise Busy(f"board busy: the update to {pend.get('version')} of run {pend.get('run')} is not judged yet")
        return cmd_begin(b, argparse.Namespace(run=DAEMON_RUN, host="the hawkBit daemon"))
    except BoardError:
        (b.state / DAEMON_SWU).unlink(missing_ok=True)  # never installed: no copy kept
        raise


def cmd_adopt(b: Board, _: argparse.Namespace) -> dict[str, Any]:
    """SWUpdate's ``postupdatecmd`` on the daemon polling hawkBit: its install becomes the
    agent's, as ``install`` ends for an ssh run. The daemon's copy (``swupdate -o``) is read
    with the agent's reader (allowlist, names, machine), the slot read back against it, the
    boot slot switched, the pending update recorded with the running slot, the boot id and
    the health warnings already there (the board judges the new slot against them), then
    the board reboots. Anything refused: nothing switched, the lease let go, last.json says why."""
    b.require(DAEMON_RUN)
    swu = b.state / DAEMON_SWU
    try:
        if not swu.is_file():
            raise StepFailed(f"SWUpdate left no copy of what it installed ({swu}): not switching")
        got = _read_for_board(b, swu)
        cur = b.current_slot()
        target = "b" if cur == "a" else "a"
        baseline = _health_warnings(b)
        out = _switch(b, DAEMON_RUN, got, cur, target, {"judge": "board", "baseline_warnings": baseline})
    except BoardError as exc:
        b.forget("FAILED", f"hawkBit install not taken: {exc}", {"run": DAEMON_RUN})
        raise
    swu.unlink()
    return {**out, "rebooting": True}


def _health(b: Board) -> dict[str, Any]:
    """The board's own ``alma-health --json`` (docs/guard.md), never saved state changed."""
    argv = [str(b.cfg.get("health", "alma-health")), "--root", str(b.root), "--json", "--no-save"]
    try:
        r = b.tool(*argv, check=False)
        got = json.loads(r.stdout)
    except (StepFailed, ValueError):
        return {"status": "UNKNOWN", "checks": []}
    return got if isinstance(got, dict) else {"status": "UNKNOWN", "checks": []}


def _health_warnings(b: Board) -> list[str]:
    checks = _health(b).get("checks")
    return sorted(str(c.get("name"))[:64] for c in checks or [] if isinstance(c, dict) and c.get("status") == "WARNING")


def _board_verdict(b: Board, pend: dict[str, Any]) -> str | None:
    """None when the running slot is healthy, else why not: the desktop's rule (docs/ota.md,
    "Healthy means"): the guard active, alma-health OK, or WARNING where every WARNING check
    already was one before the update."""
    guard = b.tool(str(b.cfg.get("systemctl", "systemctl")), "is-active", "alma-guard.service", check=False)
    state = guard.stdout.strip() or "unknown"
    if state != "active":
        return f"the guard is not running ({state})"
    h = _health(b)
    status = str(h.get("status"))
    checks = [c for c in h.get("checks") or [] if isinstance(c, dict)]
    bad = "; ".join(f"{c.get('name')}: {c.get('summary')}" for c in checks if c.get("status") != "OK")[:300]
    if status == "OK":
        return None
    if status == "WARNING":
        before = set(pend.get("baseline_warnings") or [])
        new = sorted(n for c in checks if c.get("status") == "WARNING" and (n := str(c.get("name"))[:64]) not in before)
        if not new:
            return None
        return f"health WARNING, new since the update: {', '.join(new)} ({bad})"
    return f"health {status[:16]}: {bad}"


def _arm_capsule(b: Board, im: dict[str, Any], sw: dict[str, Any]) -> dict[str, Any]:
    from almaboard.swu import CAPSULE_STAGING

    staged = b.root / CAPSULE_STAGING
    new = str(im.get("version", ""))
    running = b.slots().get("bootloader_version") or "0"
    lowest = str(b.cfg.get("lowest_bootloader") or sw.get("alma", {}).get("lowest-bootloader") or "0")
    if vtuple(new) == vtuple(running):
        staged.unlink(missing_ok=True)
        return {"version": new, "armed": False, "why": f"bootloader already {running}"}
    if vtuple(new) < vtuple(lowest):
        staged.unlink(missing_ok=True)
        return {"version": new, "armed": False, "why": f"below the lowest supported version {lowest}: refused"}
    esp = b.root / ESP_CAPSULE
    esp.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staged, esp)
    b.tool(str(b.cfg.get("set_osindications", "oe4t-set-uefi-OSIndications")))
    return {"version": new, "armed": True, "why": f"{running} -> {new}"}


def cmd_reboot(b: Board, a: argparse.Namespace) -> dict[str, Any]:
    b.require(_run_id(a.run))
    b.tool(str(b.cfg.get("reboot", "reboot")))
    return {"rebooting": True}


def cmd_commit(b: Board, a: argparse.Namespace) -> dict[str, Any]:
    run = _run_id(a.run)
    b.require(run)
    pend = b.pending()
    cur = b.current_slot()
    if pend is None or pend.get("slot") != cur:
        raise StepFailed(f"nothing to commit: running slot {cur}, pending {pend}")
    b.nvbootctrl("rootfs", "mark-boot-successful")
    b.nvbootctrl("bootloader", "verify")
    (b.state / "pending.json").unlink()
    b.release(run)
    return {"committed": cur, "version": pend.get("version")}


def cmd_rollback(b: Board, a: argparse.Namespace) -> dict[str, Any]:
    run = _run_id(a.run)
    last = read_json(b.state / "last.json")
    if b.lock() is None and isinstance(last, dict) and last.get("run") == run and last.get("result") == "ROLLED_BACK":
        # the board settled it by itself at boot (cmd_settle): the rollback is done
        return {"rolled_back_to": b.current_slot(), "reboot_needed": False, "settled": last.get("why")}
    b.require(run)
    pend = b.pending()
    cur = b.current_slot()
    if pend is not None and pend.get("slot") == cur:
        old = str(pend["from"])
        b.nvbootctrl("rootfs", "set-slot-as-unbootable", str(SLOT_NAMES.index(cur)))
        b.nvbootctrl("rootfs", "set-active-boot-slot", str(SLOT_NAMES.index(old)))
        write_json(b.state / "pending.json", {**pend, "rolling_back": True})
        return {"rolled_back_to": old, "reboot_needed": True}  # the host reboots it, then calls us again
    # Already on the old slot (the bootloader fell back, or never switched): forget the try.
    if pend is not None and pend.get("slot") != cur:
        _back_on_old_slot(b, cur)
    b.forget("ROLLED_BACK", f"rolled back; running slot {cur}", pend or {"run": run})
    return {"rolled_back_to": cur, "reboot_needed": False}


def _back_on_old_slot(b: Board, cur: str) -> None:
    """Running the old slot again after a try: make it the active slot and mark it good. The
    switch back (``set-active-boot-slot`` while the new slot ran) cleared its "successful"
    flag, and an unmarked slot spends a retry per boot until the bootloader gives up on it."""
    b.nvbootctrl("rootfs", "set-active-boot-slot", str(SLOT_NAMES.index(cur)))
    b.nvbootctrl("rootfs", "mark-boot-successful")


def cmd_settle(b: Board, _: argparse.Namespace) -> dict[str, Any]:
    """What the board does by itself (at every boot, and from its timer): finish an update no
    desktop will finish. Fell back (or rolled back and rebooted): the old slot is marked good,
    pending and lock cleared. Running the new slot uncommitted past ``verify_s`` with no live
    lease: roll back by itself. A lease expired with nothing installed: released."""
    pend, held, cur = b.pending(), b.lock(), b.current_slot()
    if pend is None:
        if held is not None and _expired(held):
            _forget_incoming(b)
            b.lock_path.unlink(missing_ok=True)
            return {"settled": "released an expired lease", "run": held.get("run")}
        return {"settled": "nothing to do"}
    if pend.get("slot") not in SLOT_NAMES:
        b.forget("FAILED", "pending.json named no slot", pend)
        return {"settled": "dropped an unreadable pending update"}
    if pend.get("boot") == b.boot_id():
        return {"settled": "installed; the reboot into it is next"}
    if cur != pend.get("slot"):
        _back_on_old_slot(b, cur)
        why = (
            "rolled back" + (f": {pend['verdict']}" if pend.get("verdict") else "")
            if pend.get("rolling_back")
            else f"slot {pend.get('slot')} did not stay: the bootloader fell back"
        )
        b.forget("ROLLED_BACK", f"{why}; running slot {cur}", pend)
        return {"settled": "back on the old slot", "slot": cur}
    now = time.time()
    if "verifying_since" not in pend:
        pend = {**pend, "verifying_since": iso(now), "verifying_boot": b.boot_id()}
        write_json(b.state / "pending.json", pend)
    if pend.get("judge") == "board" and not pend.get("rolling_back"):
        return _settle_by_health(b, pend, cur, now)
    verify_s = b.cfg.get("verify_s", VERIFY_S)
    verify_s = float(verify_s) if isinstance(verify_s, (int, float)) and verify_s > 0 else VERIFY_S
    late = parse_iso(str(pend["verifying_since"])) + verify_s <= now
    if late and (held is None or _expired(held)):  # nobody judged it in time: not good
        b.nvbootctrl("rootfs", "set-slot-as-unbootable", str(SLOT_NAMES.index(cur)))
        b.nvbootctrl("rootfs", "set-active-boot-slot", str(SLOT_NAMES.index(str(pend["from"]))))
        write_json(b.state / "pending.json", {**pend, "rolling_back": True})
        return {"settled": "no verdict in time: rolling back", "rebooting": True}
    return {"settled": "verifying", "since": pend["verifying_since"]}


def _settle_by_health(b: Board, pend: dict[str, Any], cur: str, now: float) -> dict[str, Any]:
    """The board's own verdict on an update nobody else judges (the hawkBit path): healthy on
    the new slot after a fresh boot: committed; not healthy once ``health_s`` has passed since
    its first boot there: rolled back (new slot unbootable, old slot active, reboot; the next
    boot's settle marks the old slot good). Every verdict is of the slot and boot it was taken on."""
    boot = b.boot_id()
    why = _board_verdict(b, pend)
    if why is None and b.current_slot() == cur == pend.get("slot") and b.boot_id() == boot != pend.get("boot"):
        b.nvbootctrl("rootfs", "mark-boot-successful")
        b.nvbootctrl("bootloader", "verify")
        b.forget("COMMITTED", f"healthy on slot {cur} (boot {boot}): committed by the board", pend)
        return {"settled": "committed", "slot": cur, "version": pend.get("version")}
    why = why or "the slot or boot changed while judged"
    health_s = b.cfg.get("health_s", HEALTH_S)
    if parse_iso(str(pend["verifying_since"])) + float(health_s) > now:
        write_json(b.state / "pending.json", {**pend, "verdict": why})
        return {"settled": "verifying", "since": pend["verifying_since"], "why": why}
    b.nvbootctrl("rootfs", "set-slot-as-unbootable", str(SLOT_NAMES.index(cur)))
    b.nvbootctrl("rootfs", "set-active-boot-slot", str(SLOT_NAMES.index(str(pend["from"]))))
    write_json(b.state / "pending.json", {**pend, "rolling_back": True, "verdict": why})
    return {"settled": f"not healthy within {float(health_s):.0f} s: rolling back", "why": why, "rebooting": True}


def cmd_abort(b: Board, a: argparse.Namespace) -> dict[str, Any]:
    """The operator's way out (``alma update --abort``): whoever holds the board lets go; an
    installed, uncommitted update is undone (the new slot running: switched back, and
    ``abort --reboot``, a second call whose session the reboot may cut, reboots it)."""
    held, pend, cur = b.lock(), b.pending(), b.current_slot()
    if a.reboot:
        back = pend is not None and pend.get("rolling_back") and pend.get("slot") == cur
        return {"rebooting": bool(back)}
    out: dict[str, Any] = {"released": held.get("run") if held else None, "reboot_needed": False}
    if pend is not None and pend.get("slot") == cur and pend.get("from") in SLOT_NAMES:
        b.nvbootctrl("rootfs", "set-slot-as-unbootable", str(SLOT_NAMES.index(cur)))
        b.nvbootctrl("rootfs", "set-active-boot-slot", str(SLOT_NAMES.index(str(pend["from"]))))
        write_json(b.state / "pending.json", {**pend, "rolling_back": True})
        _forget_incoming(b)
        b.lock_path.unlink(missing_ok=True)
        out["reboot_needed"] = True  # abort --reboot; at boot settle marks the old slot good
        return out
    if pend is not None:
        _back_on_old_slot(b, cur)
    b.forget("ABORTED", "aborted by the operator", pend or ({"run": held.get("run")} if held else None))
    return out


def cmd_release(b: Board, a: argparse.Namespace) -> dict[str, Any]:
    run = _run_id(a.run)
    pend = b.pending()
    if pend is not None and pend.get("run") == run and not pend.get("rolling_back"):
        raise UserError("an installed update is pending: commit or roll back first")
    (b.state / "pending.json").unlink(missing_ok=True)
    if b.release(run):
        return {"released": True}
    # Idempotent (exit 0: a host cleaning up twice is not an error), but never a false "released".
    held = b.lock()
    other = f"; the board is held by run {held.get('run')}" if held is not None else ""
    return {"released": False, "detail": f"run {run} held nothing{other}"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Board side of ALMA-OS A/B updates (docs/ota.md).",
        epilog="exit codes: 0 done, 2 refused input, 3 busy (another run), 4 step failed",
    )
    p.add_argument("--version", action="version", version=VERSION)
    p.add_argument("--root", type=Path, default=Path(os.environ.get("ALMA_OTA_ROOT") or "/"))
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("status")
    sub.add_parser("settle", help="finish what no desktop will (run at boot and by a timer)")
    sp_args = sub.add_parser("swupdate-args", help="the SWUpdate daemon's words (hawkBit: conf.d/50-alma-ota)")
    sp_args.add_argument("--suricatta", action="store_true", help="the suricatta words (the device id)")
    sub.add_parser("claim", help="the hawkBit daemon's install takes the board (SWUpdate preupdatecmd)")
    sub.add_parser("adopt", help="switch to what the hawkBit daemon installed and reboot (postupdatecmd)")
    sp_abort = sub.add_parser("abort", help="release the board and undo an uncommitted update")
    sp_abort.add_argument("--reboot", action="store_true", help="then reboot into the old slot")
    for name in ("begin", "receive", "install", "reboot", "commit", "rollback", "release"):
        sp = sub.add_parser(name)
        sp.add_argument("--run", required=True)
        if name == "begin":
            sp.add_argument("--host", default="")
        if name == "install":
            sp.add_argument("--allow-downgrade", action="store_true", help="an older version too (alma update)")
        if name == "receive":
            sp.add_argument("--sha256", required=True)
            sp.add_argument("--size", type=int, required=True)
            sp.add_argument("--offset", type=int, default=0, help="resume a cut push at this byte")
    args = p.parse_args(argv)
    handlers = {
        "status": cmd_status,
        "begin": cmd_begin,
        "receive": cmd_receive,
        "install": cmd_install,
        "reboot": cmd_reboot,
        "commit": cmd_commit,
        "rollback": cmd_rollback,
        "release": cmd_release,
        "settle": cmd_settle,
        "abort": cmd_abort,
        "swupdate-args": cmd_swupdate_args,
        "claim": cmd_claim,
        "adopt": cmd_adopt,
    }
    if args.cmd in ("claim", "adopt") and os.environ.get(IN_INSTALL):
        # The SWUpdate of an ssh run's ``install`` (which holds the agent's step lock): that
        # run switches and judges its own install.
        print(json.dumps({"skipped": f"the install of run {os.environ[IN_INSTALL][:64]} is its own"}))
        return 0

    def body() -> int:
        board: Board | None = None
        try:
            board = Board(args.root)
            # One step at a time on a board: settle (boot, timer) and a desktop's steps would
            # otherwise interleave (a commit's cleared pending.json rewritten by a settle).
            with open(board.state / ".agent.lock", "a") as serial:
                fcntl.flock(serial, fcntl.LOCK_EX)
                try:
                    out = handlers[args.cmd](board, args)
                finally:
                    if board._tmp is not None:
                        import shutil

                        shutil.rmtree(board._tmp, ignore_errors=True)
        except BoardError as exc:
            print(json.dumps({"error": str(exc), "code": exc.exit_code}))
            raise
        except OSError as exc:
            # Always a path: "error: : No space left on device" told the operator nothing.
            where = exc.filename or (board.state if board is not None else args.root)
            err = StepFailed(f"{where}: {os.strerror(exc.errno or errno.EIO)}")
            print(json.dumps({"error": str(err), "code": err.exit_code}))
            raise err from None
        if args.cmd == "swupdate-args":  # shell words for swupdate.sh, not JSON
            print(" ".join(out["words"]), flush=True)
            return 0
        print(json.dumps(out, sort_keys=True), flush=True)
        if args.cmd in ("abort", "settle", "adopt") and out.get("rebooting"):
            board.tool(str(board.cfg.get("reboot", "reboot")))  # after the answer: a reboot ends the session
        return 0

    return run_main(PROG, body)
