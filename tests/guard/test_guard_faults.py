"""Fault injection against the guard's invariants (docs/guard.md, "Invariants"): a hypothesis
state machine interleaves temperature changes, zones vanishing and coming back (two of them
sharing one type), garbage and lying values, wall-clock steps both ways, running out of file
descriptors (EMFILE), the state directory turning read-only (a real read-only bind mount) and back,
and SIGKILL (no cleanup) or SIGTERM of the guard followed by a fresh guard; after every poll
it checks the invariants against two real worker processes (/proc/PID/stat).

Ground truth is what the test wrote into the fake sysfs tree. After every poll:
- (1) the workers are alive (never killed);
- (2) work is paused while any zone reads a sane value at or above its shed threshold, or
  was hot at its last sane value and is now missing, unparsable or implausible, or (the
  fail-closed rule) while no zone reads a sane value at all; a SIGTERM in such a state
  leaves the work paused;
- (3) once every zone has read a sane value below its resume threshold for the hold-off
  (plus the polls the rate rule needs to accept a big but real change), the work runs,
  whatever files were lost (the pause record can be unwritable for the whole run);
- (4) a poll never raises, the state's ``errors`` name the read-only state file while /run
  is read-only, and clear once it is writable again;
- (5) the state file is rewritten on the monotonic period whatever the wall clock did (its
  wall stamp never lags the wall clock by more than a period).

``ALMA_GUARD_MUTANT=<name>`` (bench/mutants_guard.py runs them all) patches one rule out of
the guard: the machine must find a violation for every mutant.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from almaboard.files import parse_iso, read_json
from almaboard.paths import Paths
from almaguard.config import GuardConfig
from almaguard.forensics import Forensics
from almaguard.guard import Guard
from almaguard.pause import stop_pending
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule
from support import IN_CI
from support_guard import FakeBoard, ReadOnly, proc_state, remove_zone, restore_zone, set_raw

# Keys of the fake tree's zones; soc-a and soc-b share the type "soc-thermal" (the guard
# names them soc-thermal and soc-thermal#1): one of them vanishing must not be forgotten.
ZONES = ("tj-thermal", "cpu-thermal", "soc-a", "soc-b")
ZONE_TYPE = {"soc-a": "soc-thermal", "soc-b": "soc-thermal"}
SHED, RESUME = 89.0, 79.0  # Orin trips: passive 99 - margin 10, hysteresis 10
HOLDOFF = 3.0
SETTLE = HOLDOFF + 4.0  # hold-off + polls for the rate rule to accept a big real change
SANE = (-40.0, 150.0)
GARBAGE = ("-273150", "-2147483648", "2147483647", "banana", "", "99999999999999999999")

MUTANT = os.environ.get("ALMA_GUARD_MUTANT", "")
STATS = {"runs": 0, "polls": 0}
PROC = Path("/proc")


def apply_mutant(name: str, monkeypatch: Any) -> None:
    """Drop one rule of the guard (only ever in this test process)."""
    import almaboard.thermal as th
    import almaguard.guard as g
    import almaguard.pause as pz

    if name == "no-shed-on-hot":
        orig_step = g.Guard.step

        def step(self: g.Guard, now: float) -> str | None:
            for t in self.thresholds.values():
                t.shed_c = 1e9
            self._shed_c = dict.fromkeys(self._shed_c, 1e9)
            return orig_step(self, now)

        monkeypatch.setattr(g.Guard, "step", step)
    elif name == "no-fail-closed":  # no zone readable -> keep going
        orig = g.Guard._shed

        def shed(self: g.Guard, now: float, reason: str) -> str:
            if "fail closed" in reason:
                return None  # type: ignore[return-value]
            return orig(self, now, reason)

        monkeypatch.setattr(g.Guard, "_shed", shed)
    elif name in ("no-range-check", "no-rate-check"):
        import almaguard.config as gc

        inf = float("inf")
        loose = {"no-range-check": {"min_c": -inf, "max_c": inf}, "no-rate-check": {"max_rate_c_per_s": inf}}[name]
        orig_prop = gc.GuardConfig.plausibility.fget  # type: ignore[attr-defined]
        monkeypatch.setattr(gc.GuardConfig, "plausibility", property(lambda self: replace(orig_prop(self), **loose)))
        if name == "no-range-check":
            monkeypatch.setattr(gc.GuardConfig, "plausible_min_c", -inf, raising=False)
            monkeypatch.setattr(gc.GuardConfig, "plausible_max_c", inf, raising=False)
    elif name == "unreadable-does-not-block-resume":  # the old rule: only readable zones count
        orig_split = th.Reader.read_split

        def read_split(self: th.Reader, now: float, verify: bool = False) -> Any:
            ok, bad = orig_split(self, now, verify)
            return (ok, {}) if ok else (ok, bad)

        monkeypatch.setattr(th.Reader, "read_split", read_split)
    elif name == "hot-jump-is-not-hot":
        orig_split2 = th.Reader.read_split

        def read_split2(self: th.Reader, now: float, verify: bool = False) -> Any:
            ok, bad = orig_split2(self, now, verify)
            return ok, {k: th.Reading(None, v.problem, None) for k, v in bad.items()}

        monkeypatch.setattr(th.Reader, "read_split", read_split2)
    elif name == "no-recovery-from-machine":  # the old _adopt: only what paused.json says

        def adopt(self: pz.Pauser) -> None:
            rec = pz.read_json(self.record)
            if isinstance(rec, dict) and rec.get("cgroup") == str(self.cgroup):
                self.method = rec.get("method")
                self.stopped = {int(p) for p in rec.get("pids", []) if isinstance(p, int)}

        monkeypatch.setattr(pz.Pauser, "_adopt", adopt)
    elif name == "state-errors-raise":  # the old _save: a read-only /run kills the guard
        from almaboard.files import write_json

        def save(self: pz.Pauser) -> None:
            if self.method is None:
                if self.record.exists():
                    self.record.unlink()
                return
            write_json(self.record, {"cgroup": str(self.cgroup), "method": self.method, "pids": sorted(self.stopped)})

        monkeypatch.setattr(pz.Pauser, "_save", save)
    elif name == "sigterm-resumes-when-blind":  # the old _stop: only readable zones counted
        orig_stop = g.Guard._stop

        def stop(self: g.Guard) -> None:
            self.status.unreadable = []
            orig_stop(self)

        monkeypatch.setattr(g.Guard, "_stop", stop)
    elif name == "forget-vanished-zones":
        orig_step = g.Guard.step

        def step2(self: g.Guard, now: float) -> str | None:
            present = [z for z in self.zones if (z.path / "temp").exists()]
            if len(present) != len(self.zones):
                self._set_zones(present)
            return orig_step(self, now)

        monkeypatch.setattr(g.Guard, "step", step2)
    elif name == "zones-by-type":  # the old discover, keyed by the type-derived name
        import almaboard.thermal as th2

        def discover(self: g.Guard, now: float) -> None:
            self._last_discover = now
            found = th2.discover(self.paths.thermal, self.cfg.include, self.cfg.exclude)
            known = {z.name: z for z in self.zones}
            for z in found:
                known[z.name] = z
            self._set_zones(list(known.values()))
            self._probe = self._next_zone_path()

        monkeypatch.setattr(g.Guard, "discover", discover)
    elif name == "no-thaw-retry":
        monkeypatch.setattr(g.Guard, "_retry_thaw", lambda self, now: None)
    elif name == "thaw-forgotten":  # the old resume: a failed thaw still forgets the pause
        orig_resume = pz.Pauser.resume

        def resume(self: pz.Pauser) -> pz.PauseResult:
            res = orig_resume(self)
            self.thaw_error, self.method = "", None
            return res

        monkeypatch.setattr(pz.Pauser, "resume", resume)
    elif name == "state-refresh-on-wall-clock":
        orig_write = g.Guard.write_state

        def write_state(self: g.Guard, now_wall: float) -> None:
            last = getattr(self, "_wall_written", float("-inf"))
            if now_wall - last < 0 and not self.status.errors:
                return  # the old rule: a wall clock stepped back looks like "written just now"
            self._wall_written = now_wall
            orig_write(self, now_wall)

        monkeypatch.setattr(g.Guard, "write_state", write_state)
    elif name == "freshness-on-wall-clock":
        import almaboard.files as bf

        def state_age(state: dict[str, Any], *, wall: float, boot: str, now_boottime: float) -> float:
            try:
                return wall - bf.parse_iso(str(state.get("updated")))
            except ValueError:
                return float("inf")

        monkeypatch.setattr(bf, "state_age", state_age)
        import almaguard.health as hl

        monkeypatch.setattr(hl, "state_age", state_age)
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "idlegrid"))
        import erangrid.thermal as et

        monkeypatch.setattr(et, "state_age", state_age)
    elif name == "blind-is-not-hot":  # tj or a majority unreadable keeps going
        monkeypatch.setattr(g.Guard, "_blind", lambda self, unreadable: "")
    elif name == "critical-zones-ignored":
        orig_blind = g.Guard._blind

        def blind(self: g.Guard, unreadable: list[str]) -> str:
            why = orig_blind(self, unreadable)
            return "" if why.startswith("critical") else why

        monkeypatch.setattr(g.Guard, "_blind", blind)
    elif name == "no-fd-budget":
        # The reader keeps a descriptor per zone, whatever the limit. (Patching getrlimit
        # instead broke the EMFILE test's own setrlimit: a "catch" by the test crashing.)
        real_init = th.Reader.__init__

        def unbudgeted(self: th.Reader, *a: Any, **kw: Any) -> None:
            real_init(self, *a, **kw)
            self.keep_fds = 10**9

        monkeypatch.setattr(th.Reader, "__init__", unbudgeted)
    elif name == "no-stuck-flag":
        monkeypatch.setattr(g.Guard, "_track_stuck", lambda self, now, ok: False)
    elif name == "new-zone-waits-for-rediscovery":
        monkeypatch.setattr(g.Guard, "_next_zone_path", lambda self: "/nonexistent/alma-guard-probe")
    elif name == "health-untyped-state":
        import almaguard.health as hl2

        monkeypatch.setattr(
            hl2,
            "load_state",
            lambda path: (lambda d: (d if isinstance(d, dict) else {}, {}))(hl2.read_json(path)),
        )
    elif name:
        raise ValueError(f"unknown mutant {name}")


MUTANTS = (
    "no-shed-on-hot",
    "no-fail-closed",
    "no-range-check",
    "no-rate-check",
    "unreadable-does-not-block-resume",
    "hot-jump-is-not-hot",
    "no-recovery-from-machine",
    "state-errors-raise",
    "sigterm-resumes-when-blind",
    "forget-vanished-zones",
    # the trust invariants (caught by this machine or by tests/guard/test_guard_trust.py)
    "zones-by-type",
    "no-thaw-retry",
    "thaw-forgotten",
    "state-refresh-on-wall-clock",
    "freshness-on-wall-clock",
    "blind-is-not-hot",
    "critical-zones-ignored",
    "no-fd-budget",
    "no-stuck-flag",
    "new-zone-waits-for-rediscovery",
    "health-untyped-state",
)


class Truth:
    """What each zone's file says: a sane number, garbage, or nothing."""

    def __init__(self) -> None:
        self.value: dict[str, float | None] = dict.fromkeys(ZONES, 50.0)  # None: missing/garbage
        self.was_hot: dict[str, bool] = dict.fromkeys(ZONES, False)
        self.lying: set[str] = set()  # a plausible-looking value that is not the temperature

    def sane(self, z: str) -> bool:
        v = self.value[z]
        return v is not None and SANE[0] <= v <= SANE[1] and z not in self.lying

    def must_pause(self) -> str:
        for z in ZONES:
            if self.sane(z) and self.value[z] is not None and self.value[z] >= SHED:  # type: ignore[operator]
                return f"{z} reads {self.value[z]} >= shed"
            if not self.sane(z) and self.was_hot[z]:
                return f"{z} was hot and is blind"
        if not any(self.sane(z) for z in ZONES):
            return "no zone readable"
        return ""

    def calm(self) -> bool:
        return all(self.sane(z) and self.value[z] < RESUME for z in ZONES)  # type: ignore[operator]


class GuardFaults(RuleBasedStateMachine):
    monkeypatch: Any = None

    @initialize()
    def setup(self) -> None:
        STATS["runs"] += 1
        # tmpfs where there is one: the guard fsyncs its forensics, and the state machine
        # restarts it hundreds of times (fsync on tmpfs is free; the logic is the same).
        shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.tmp = Path(tempfile.mkdtemp(prefix="guard-faults-", dir=shm))
        self.board = FakeBoard(self.tmp / "board")
        for z in ZONES:
            self.board.add_zone(ZONE_TYPE.get(z, z), 50.0, key=z)
        self.workers = [
            subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.02)"]) for _ in range(2)
        ]
        self.board.set_slice_pids([w.pid for w in self.workers])
        self.run_dir = self.board.p("/run/alma-guard")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ro = ReadOnly(self.run_dir)
        self.t = 1000.0
        self.wall_offset = 0.0  # wall-clock steps (NTP, RTC, an operator), both ways
        self.emfile = False
        self.lost_at = float("-inf")
        self.stepped_at = float("-inf")
        self.emfile_at = float("-inf")
        self.truth = Truth()
        self.calm_since: float | None = self.t
        self.ro_since: float | None = None
        self.rw_since: float | None = self.t
        self.guard = self._new_guard()
        self._poll()

    def _new_guard(self) -> Guard:
        cfg = GuardConfig(holdoff_s=HOLDOFF, state_every_s=2.0, ring_every_s=600.0)
        paths = Paths(self.board.root)
        guard = Guard(
            cfg, paths, wall=lambda: 1_780_000_000.0 + self.t + self.wall_offset, forensics=Forensics(paths, 600.0)
        )
        guard.start_forensics()
        return guard

    def teardown(self) -> None:
        if not hasattr(self, "workers"):
            return
        self.ro.off()
        self.guard.reader.close()
        for w in self.workers:
            with_suppress_kill(w)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers -------------------------------------------------------------------------
    def _poll(self, seconds: float = 1.0) -> None:
        STATS["polls"] += 1
        end = self.t + seconds
        while self.t < end:
            self.t += 1.0
            self.guard.step(self.t)  # (4): a poll never raises
            self._check()

    def _changed(self) -> None:
        self.calm_since = self.t if self.truth.calm() else None

    def _states(self, want_stopped: bool) -> list[str]:
        """The workers' states, once all are as wanted or after a deadline: signal delivery is
        asynchronous, and a stopped worker shows T only once the loaded machine runs it. A
        worker with a SIGSTOP still pending counts as stopped ("T"): it is about to be."""
        deadline = time.monotonic() + 60.0
        while True:
            states = ["T" if stop_pending(PROC, w.pid) else proc_state(w.pid) for w in self.workers]
            if all((s == "T") == want_stopped for s in states) or time.monotonic() > deadline:
                return states
            time.sleep(0.002)

    def _check(self) -> None:
        states = [proc_state(w.pid) for w in self.workers]
        assert all(s not in ("", "Z", "X") for s in states), f"(1) a worker died: {states}"
        why = self.truth.must_pause()
        if why:
            states = self._states(want_stopped=True)
            assert all(s == "T" for s in states), f"(2) work runs while {why}: {states}"
        if self.truth.calm() and self.calm_since is not None and self.t - self.calm_since >= SETTLE:
            states = self._states(want_stopped=False)
            assert all(s != "T" for s in states), f"(3) work stranded {self.t - self.calm_since:.0f} s after calm"
        errors = self.guard.status.errors
        settled = self.t - max(self.rw_since or float("inf"), self.stepped_at) >= 3.0
        if not self.ro.mounted and not self.emfile and settled:
            # (5) the state file is rewritten on the monotonic period whatever the wall clock
            # did: its wall stamp is never more than one period behind the wall clock now.
            state = read_json(self.run_dir / "state.json")
            if isinstance(state, dict):
                lag = 1_780_000_000.0 + self.t + self.wall_offset - parse_iso(state["updated"])
                assert -2.0 <= lag <= 4.0, f"(5) state not refreshed: its stamp is {lag:.0f} s off the wall clock"
            else:  # its files were just lost: rewritten within one period
                assert self.t - self.lost_at <= 3.0, "(5) the state file was not rewritten"
        if self.ro_since is not None and self.t - self.ro_since >= 3.0:
            assert any("state.json" in e for e in errors), f"(4) read-only /run not reported: {errors}"
        if self.rw_since is not None and self.t - self.rw_since >= 3.0 and not self.emfile:
            # (the forensics ring is rewritten every ring_every_s: an EMFILE'd write shows till then)
            errors = [e for e in errors if "ring.json" not in e or self.t - self.emfile_at > 600.0]
            assert errors == [], f"(4) errors not cleared after /run came back: {errors}"

    def _hot_update(self, z: str) -> None:
        if self.truth.sane(z):
            self.truth.was_hot[z] = self.truth.value[z] >= SHED  # type: ignore[operator]

    # -- rules ---------------------------------------------------------------------------
    @rule(z=st.sampled_from(ZONES), temp=st.sampled_from([20.0, 50.0, 75.0, 85.0, 92.0, 100.0]))
    def set_temp(self, z: str, temp: float) -> None:
        if self.truth.value[z] is None and not (self.board._zones[z] / "temp").exists():
            restore_zone(self.board, z, temp)
        else:
            self.board.set_temp(z, temp)
        self.truth.value[z] = temp
        self.truth.lying.discard(z)
        self._hot_update(z)
        self._changed()
        self._poll()

    @rule(z=st.sampled_from(ZONES), text=st.sampled_from(GARBAGE))
    def garbage(self, z: str, text: str) -> None:
        if not (self.board._zones[z] / "temp").exists():
            restore_zone(self.board, z, 50.0)
        set_raw(self.board, z, text + "\n")
        self.truth.value[z] = None
        self.truth.lying.discard(z)
        self._changed()
        self._poll()

    @precondition(lambda self: any(self.truth.sane(z) and self.truth.value[z] >= SHED for z in ZONES))
    @rule(z=st.sampled_from(ZONES), low=st.sampled_from([20.0, 30.0]))
    def sensor_lies_low(self, z: str, low: float) -> None:
        """A hot zone reads a plausible-looking low value (a glitch): it is still hot."""
        if not (self.truth.sane(z) and self.truth.value[z] >= SHED):  # type: ignore[operator]
            return
        self.board.set_temp(z, low)
        self.truth.lying.add(z)
        self._changed()
        self._poll()
        # the glitch lasts one poll, and a SIGTERM may land right in it
        self.board.set_temp(z, self.truth.value[z])  # type: ignore[arg-type]
        self.truth.lying.discard(z)
        self._changed()
        self._poll()

    @rule(z=st.sampled_from(ZONES), whole_dir=st.booleans())
    def vanish(self, z: str, whole_dir: bool) -> None:
        if not (self.board._zones[z] / "temp").exists():
            return
        remove_zone(self.board, z, whole_dir)
        self.truth.value[z] = None
        self._changed()
        self._poll()

    @rule(on=st.booleans())
    def state_dir(self, on: bool) -> None:
        why = ReadOnly.available()
        if why:
            return
        if on and not self.ro.mounted:
            self.ro.on()
            self.ro_since, self.rw_since = self.t, None
        elif not on and self.ro.mounted:
            self.ro.off()
            self.ro_since, self.rw_since = None, self.t
        self._poll()

    def _hot_zones(self) -> list[str]:
        return [z for z in ZONES if self.truth.sane(z) and self.truth.value[z] >= SHED]  # type: ignore[operator]

    @rule(z=st.sampled_from(ZONES), peak=st.sampled_from([92.0, 100.0]))
    def heat_spike(self, z: str, peak: float) -> None:
        """A load step: a cool zone is hot one poll later (faster than the rate rule allows:
        the guard must shed on it all the same)."""
        if not (self.board._zones[z] / "temp").exists():
            restore_zone(self.board, z, 20.0)
        self.board.set_temp(z, 20.0)
        self.truth.value[z] = 20.0
        self.truth.lying.discard(z)
        self._hot_update(z)
        self._changed()
        self._poll()
        self.board.set_temp(z, peak)
        self.truth.value[z] = peak
        self._hot_update(z)
        self._changed()
        self._poll()

    @precondition(lambda self: bool(self._hot_zones()))
    @rule(low=st.sampled_from([20.0, 30.0]))
    def glitch_at_stop(self, low: float) -> None:
        """A hot zone reads a plausible-looking low value for one poll, and the guard is
        stopped (SIGTERM) right then. (A guard started during the glitch has no earlier
        reading to judge it by: no rule can tell that lie, so it is not injected.)"""
        z = self._hot_zones()[0]
        hot = self.truth.value[z]
        self.board.set_temp(z, low)
        self.truth.lying.add(z)
        self.t += 1.0
        self.guard.step(self.t)
        self._check()
        self.guard._stop()
        self._check()  # (2): the glitch is no reason to resume on the way out
        self.board.set_temp(z, hot)  # type: ignore[arg-type]
        self.truth.lying.discard(z)
        self.guard = self._new_guard()
        self._changed()
        self._poll()

    @precondition(lambda self: bool(self._hot_zones()))
    @rule(text=st.sampled_from(GARBAGE))
    def garbage_across_a_restart(self, text: str) -> None:
        """A hot zone's sensor turns to garbage while the guard is being restarted."""
        z = self._hot_zones()[0]
        set_raw(self.board, z, text + "\n")
        self.truth.value[z] = None
        self.guard.reader.close()
        self.guard = self._new_guard()
        self._changed()
        self._poll()

    @rule()
    def restart_with_run_dir_cleared(self) -> None:
        """SIGKILL, and /run/alma-guard comes back empty (a runtime directory not preserved)."""
        self.guard.reader.close()
        if not self.ro.mounted:
            for f in self.run_dir.iterdir():
                f.unlink()
            self.lost_at = self.t
        self.guard = self._new_guard()
        if self.truth.calm():
            self.calm_since = self.t
        self._poll()

    @rule()
    def lose_run_files(self) -> None:
        """/run/alma-guard's files are lost (cleared by hand, a tmpfs remounted)."""
        if self.ro.mounted:
            return
        for f in self.run_dir.iterdir():
            f.unlink()
        self.lost_at = self.t
        self._poll()

    @rule(kill9=st.booleans())
    def restart(self, kill9: bool) -> None:
        if kill9:
            self.guard.reader.close()  # the kernel closes a killed process's files; nothing else runs
        else:
            self.guard._stop()  # SIGTERM
            self._check()  # (2): a SIGTERM while hot or blind leaves the work paused
        self.guard = self._new_guard()
        if self.truth.calm():
            self.calm_since = self.t  # a new guard holds off from its start
        self._poll()

    @rule(n=st.integers(1, 10))
    def wait(self, n: int) -> None:
        self._poll(float(n))

    @rule(delta=st.sampled_from([-3600.0, -30.0, 30.0, 3600.0]))
    def wall_clock_step(self, delta: float) -> None:
        """The wall clock jumps (either way): nothing the guard decides may change."""
        self.wall_offset += delta
        self.stepped_at = self.t
        self._poll(4.0)

    @rule(polls=st.integers(1, 3))
    def out_of_descriptors(self, polls: int) -> None:
        """The process runs out of file descriptors (EMFILE) for a few polls: every poll still
        returns, work stays paused while a zone is blind, and the guard says so."""
        import resource

        self.guard.reader.close()  # its kept descriptors go: the reads must open afresh
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        used = len(os.listdir("/proc/self/fd"))
        self.emfile = True
        self.emfile_at = self.t
        resource.setrlimit(resource.RLIMIT_NOFILE, (used, hard))
        try:
            for _ in range(polls):
                self.t += 1.0
                self.guard.step(self.t)  # (4): never raises
                assert self.guard.status.shedding, "(2) blind (EMFILE) and not shedding"
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        if self.truth.calm():
            # The blind polls paused the work (fail closed) and restart the hold-off: (3)
            # counts from their end, also in the check right after them.
            self.calm_since = self.t
        self._check()
        self.emfile = False
        self.rw_since = self.t if not self.ro.mounted else None
        self._poll()


def with_suppress_kill(p: subprocess.Popen[bytes]) -> None:
    import signal

    if p.poll() is None:
        os.kill(p.pid, signal.SIGCONT)
        p.kill()
    p.wait(timeout=5)


def _blind_after_long_calm() -> None:
    machine = GuardFaults()
    machine.setup()
    try:
        machine.wait(10)
        machine.out_of_descriptors(1)
        assert machine.guard.transitions[-1][1] == "shed"
        machine.wait(int(SETTLE))  # (3) checked at every poll: resumed within the hold-off
        assert machine.guard.transitions[-1][1] == "resume"
    finally:
        machine.teardown()


def test_blind_polls_after_a_long_calm_pause_the_work_and_restart_the_holdoff() -> None:
    """EMFILE after a long calm: the guard sheds (fail closed), and (3) counts the calm from
    the end of the blind polls (the machine once checked it against the calm before them: a
    false "stranded" whenever the stop had landed by the check), then the work runs again.
    In a fresh interpreter: how many descriptors the EMFILE poll leaves free (whether its
    SIGSTOP goes out at all) depends on the holes in the descriptor table, and pytest's vary."""
    here = Path(__file__).resolve().parent
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('faults', {str(Path(__file__).resolve())!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "mod._blind_after_long_calm()\n"
    )
    root = here.parents[1]
    path = [root / "tests", here, root / "tools" / "guard", root / "tools" / "board"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.slow
def test_guard_invariants_hold_under_injected_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    why = ReadOnly.available()
    if why and IN_CI:
        pytest.fail(why)
    if MUTANT:
        apply_mutant(MUTANT, monkeypatch)
    examples = int(os.environ.get("ALMA_GUARD_FAULT_EXAMPLES", "100"))
    machine = settings(
        max_examples=examples,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        database=None,
        # A mutant run only needs to know THAT it is caught: skip shrinking the example.
        phases=[Phase.explicit, Phase.reuse, Phase.generate] if MUTANT else list(Phase),
    )(GuardFaults)
    machine.TestCase().runTest()
    print(f"guard fault machine: {STATS['runs']} runs, {STATS['polls']} injected faults/waits")
    assert STATS["runs"] >= min(examples, 50)  # the machine really ran (a round may end early)
