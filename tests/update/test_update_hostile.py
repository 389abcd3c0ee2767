"""A hostile or broken board talking to `alma update`, and records edited between runs.

The board's answers (alma-ota's JSON over ssh) are untrusted text: escapes, oversized or
deeply nested JSON, fields of the wrong type, a slot that makes no sense. Each must end that
board's run as FAILED with a safe one-line reason (never a crash of the whole run, never an
ESC in the record or on the terminal). Here ssh is replaced by a scripted transport (the
parsing is the point); the real-ssh flow is tests/update/test_update_e2e.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support_swu import build_swu
from support_update import MACHINE, rootfs_image

from alma.errors import ConfigError
from alma.fleet.inventory import Fleet, Node
from alma.fleet.ssh import RemoteResult
from alma.update import engine as E
from alma.update import records as R
from alma.update.swu import read_swu

GOOD_STATUS = {"machine": MACHINE, "version": "1.0.0", "current_slot": "a", "slots": {}, "boot_id": "x",
               "lock": None, "pending": None, "guard": "active"}  # fmt: skip
ESC = "\x1b]0;owned\x07\x1b[2J\x1b[31m"


@pytest.fixture
def swu(tmp_path: Path, signer: tuple[bytes, bytes]) -> Path:
    img = rootfs_image(tmp_path / "r.ext4", "1.1.0")
    out = tmp_path / "u.swu"
    build_swu(out, machine=MACHINE, version="1.1.0", rootfs=img, cert_pem=signer[0], key_pem=signer[1], root="")
    return out


def run(tmp: Path, swu: Path, answer: Callable[[str], RemoteResult], nodes: tuple[str, ...] = ("b1",),
        run_name: str | None = None) -> E.RunReport:  # fmt: skip
    fleet = Fleet(tmp / "fleet.toml", tuple(Node(n, n, "board") for n in nodes))
    info = read_swu(swu)
    opts = E.Options(canary=0, batch=len(nodes), boot_timeout=2, health_timeout=0, poll_s=0.05)

    def remote(node: Node, command: str, _cfg: Any, **_: Any) -> RemoteResult:
        return answer(command)

    ctx = E.Context(fleet=fleet, swu=swu, info=info, opts=opts, root=tmp / "records",
                    run=run_name or E.run_id(info), remote=remote)  # fmt: skip
    return E.run_update(ctx, list(fleet.nodes))


def said(*lines: str, rc: int = 0, error: str | None = None, stderr: tuple[str, ...] = ()) -> RemoteResult:
    return RemoteResult("b1", "alma-ota", rc, list(lines), 0.01, error=error, stderr=list(stderr))


def status_is(doc: Any) -> Callable[[str], RemoteResult]:
    text = doc if isinstance(doc, str) else json.dumps(doc)
    return lambda cmd: said(text) if cmd.endswith(" status") else said('{"error": "unexpected"}', rc=4)


HOSTILE: dict[str, tuple[Callable[[str], RemoteResult], str]] = {
    "ESC in the machine": (status_is({**GOOD_STATUS, "machine": ESC + "x"}), "refused: this .swu is for"),
    "ESC in the error": (lambda c: said(json.dumps({"error": ESC * 3}), rc=4), "not updated"),
    "ESC on ssh's stderr": (lambda c: said(rc=255, error="unreachable", stderr=(ESC,)), "not updated"),
    "a megabyte of error": (lambda c: said(json.dumps({"error": "A" * 1_000_000}), rc=4), "not updated"),
    "nested 100000 deep": (status_is('{"a":' + "[" * 100_000 + "]" * 100_000 + "}"), "no JSON answer"),
    "not JSON at all": (status_is("Welcome to the board!\x1b[5m"), "no JSON answer"),
    "JSON that is a list": (status_is("[1, 2, 3]"), "no JSON answer"),
    "output over the limit": (lambda c: said("1048576", error="over-limit"), "output over limit"),
    "slots, pending, lock of wrong types": (
        status_is({**GOOD_STATUS, "slots": [1], "pending": "yes", "lock": 7, "machine": ["x"]}),
        "refused: this .swu is for",
    ),
    "no current slot": (status_is({**GOOD_STATUS, "current_slot": None}), "no valid current slot"),
    "a third slot": (status_is({**GOOD_STATUS, "current_slot": "../c"}), "no valid current slot"),
    "a pending update naming no slot": (
        status_is({**GOOD_STATUS, "pending": {"run": "RUN", "slot": {"x": 1}}, "lock": {"run": "RUN"}}),
        "pending update names no valid slot",
    ),
    "a lock held with ESC": (status_is({**GOOD_STATUS, "lock": {"run": ESC, "host": ESC}}), "board busy"),
}


def _no_escape(obj: Any) -> None:
    """No control character in any string of ``obj`` (json.dumps would hide them as \\u001b)."""
    if isinstance(obj, str):
        assert not any(ord(c) < 32 or ord(c) == 127 for c in obj), repr(obj[:80])
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _no_escape(k)
            _no_escape(v)
    elif isinstance(obj, list):
        for v in obj:
            _no_escape(v)


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_board_answers_fail_that_board_with_a_safe_reason(tmp_path: Path, swu: Path, case: str) -> None:
    answer, why = HOSTILE[case]
    info = read_swu(swu)
    run_name = E.run_id(info)

    def a(cmd: str) -> RemoteResult:  # the pending case needs this run's real id
        r = answer(cmd)
        r.lines = [ln.replace("RUN", run_name) for ln in r.lines]
        return r

    report = run(tmp_path, swu, a, run_name=run_name)
    [rec] = report.records
    assert rec.result == R.FAILED and why in (rec.reason or ""), rec.reason
    assert len(rec.reason or "") <= 1000
    _no_escape(rec.to_dict())
    on_disk = R.load_existing(tmp_path / "records", info.sha256, "b1")
    assert on_disk is not None
    _no_escape(on_disk.to_dict())
    log = (R.campaign_dir(tmp_path / "records", info.sha256) / "b1.log").read_text()
    assert "\x1b" not in log and len(log) < 100_000
    assert report.exit_code == E.EXIT_SOME_FAILED


def test_install_answering_the_running_slot_is_not_rebooted(tmp_path: Path, swu: Path) -> None:
    calls: list[str] = []

    def a(cmd: str) -> RemoteResult:
        calls.append(cmd.split()[1])
        if cmd.endswith(" status"):
            return said(json.dumps(GOOD_STATUS))
        if " install " in cmd:
            return said(json.dumps({"slot": "a", "capsule": {"armed": ESC, "junk": "x" * 10_000}}))
        if cmd.startswith("python3") or "health" in cmd:
            return said(json.dumps({"status": "OK", "checks": []}))
        return said("{}")

    [rec] = run(tmp_path, swu, a).records
    assert rec.result == R.FAILED and "target slot a while running a" in (rec.reason or "")
    assert "reboot" not in calls


# ---- records edited between runs --------------------------------------------------------------


def _first_run(tmp: Path, swu: Path) -> Path:
    """A run that stops at the check (the board refuses: another machine), leaving a record."""
    run(tmp, swu, status_is({**GOOD_STATUS, "machine": "other"}))
    return R.record_path(tmp / "records", read_swu(swu).sha256, "b1")


TAMPER: dict[str, Callable[[dict[str, Any]], None]] = {
    "node points elsewhere": lambda d: d.update(node="../../../../tmp/escaped"),
    "another board's name": lambda d: d.update(node="b2"),
    "another .swu": lambda d: d.update(swu_sha256="0" * 64),
    "unknown result": lambda d: d.update(result="WHATEVER"),
    "slot not a or b": lambda d: d.update(result="INTERRUPTED", to_slot="../x"),
    "phases not a list": lambda d: d.update(phases="check"),
    "phase duration text": lambda d: d["phases"][0].update(duration_s="1 s"),
    "phase of another tool": lambda d: d["phases"][0].update(name="flash"),
    "wave a string": lambda d: d.update(wave="1"),
    "reason a table": lambda d: d.update(reason={"x": 1}),
    "baseline not names": lambda d: d.update(baseline_warnings=[1, 2]),
    "not JSON": lambda d: d.clear(),
}


@pytest.mark.parametrize("case", list(TAMPER))
def test_a_record_edited_between_runs_stops_the_run_before_any_board(tmp_path: Path, swu: Path, case: str) -> None:
    path = _first_run(tmp_path, swu)
    data = json.loads(path.read_text())
    data["result"] = "INTERRUPTED"
    TAMPER[case](data)
    path.write_text(json.dumps(data) if data else "{not json")
    calls: list[str] = []

    def a(cmd: str) -> RemoteResult:
        calls.append(cmd)
        return said(json.dumps(GOOD_STATUS))

    with pytest.raises(ConfigError, match="b1.json"):
        run(tmp_path, swu, a, nodes=("b0", "b1"))
    assert calls == []  # no board touched, not even the one whose record is fine
    assert not Path("/tmp/escaped.json").exists()
    assert sorted(p.name for p in path.parent.iterdir() if not p.name.startswith(".")) == ["b1.json", "b1.log"]
    assert R.updating(tmp_path / "records") == {}  # fleet health ignores it too


def test_a_record_under_another_name_does_not_mark_that_board_mid_update(tmp_path: Path, swu: Path) -> None:
    path = _first_run(tmp_path, swu)
    data = json.loads(path.read_text())
    data["result"] = "INTERRUPTED"
    path.write_text(json.dumps(data))
    assert set(R.updating(tmp_path / "records")) == {"b1"}
    path.rename(path.with_name("b9.json"))  # b1's record copied under b9's name
    assert R.updating(tmp_path / "records") == {}


# ---- two runs at once ---------------------------------------------------------------------------


def test_two_runs_of_one_swu_on_one_desktop_the_second_is_refused(tmp_path: Path, swu: Path) -> None:
    """The board refuses a second run by its lock (test_failure_model.py); on the desktop a
    flock per .swu refuses the second process before it asks any board anything."""
    import os
    import subprocess
    import sys

    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[[node]]\nname = "b1"\nssh = "nobody@192.0.2.1"\nrole = "board"\n')
    state = tmp_path / "state"
    with R.CampaignLock(R.campaign_dir(state / "alma" / "update", read_swu(swu).sha256)):
        r = subprocess.run([sys.executable, "-m", "alma", "update", str(swu), "--fleet", str(fleet)],
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "XDG_STATE_HOME": str(state), "HOME": str(tmp_path)})  # fmt: skip
    assert r.returncode == 2 and "another alma update of this .swu is running" in r.stderr, r.stderr
    assert not list((state / "alma" / "update").glob("*/b1.json"))  # nothing recorded, nobody asked


@pytest.mark.parametrize("name", ["../../etc/x", "a/b", ".hidden", "x\x1b[2J", "", "a" * 64, "campaign/.."])
def test_a_node_name_that_could_reach_a_path_never_leaves_the_fleet_file(tmp_path: Path, name: str) -> None:
    """Record and log paths are <campaign>/<node>.json|.log: the fleet file's name grammar
    (letters, digits, '.', '_', '-', starting alphanumeric, <= 63) is what keeps them inside."""
    from alma.fleet.inventory import parse_fleet

    with pytest.raises(ConfigError):
        parse_fleet(f'[[node]]\nname = {json.dumps(name)}\nssh = "x"\nrole = "board"\n', tmp_path / "f.toml")


def test_a_final_record_is_printed_without_its_escapes(tmp_path: Path, swu: Path) -> None:
    """The terminal is the last line of defence: a (hand-edited) final record's reason is
    printed with its escapes made visible; the board is not asked anything (final)."""
    import os
    import subprocess
    import sys

    state = tmp_path / "state"
    info = read_swu(swu)
    rec = R.UpdateRecord(node="b1", run="r", swu_sha256=info.sha256, swu_version=info.version, machine=MACHINE,
                         started=R.now(), result=R.ROLLED_BACK, reason="refused " + ESC + "done")  # fmt: skip
    R.save(state / "alma" / "update", rec)
    fleet = tmp_path / "fleet.toml"
    fleet.write_text('[[node]]\nname = "b1"\nssh = "nobody@192.0.2.1"\nrole = "board"\n')
    r = subprocess.run([sys.executable, "-m", "alma", "update", str(swu), "--fleet", str(fleet)],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "XDG_STATE_HOME": str(state), "HOME": str(tmp_path)})  # fmt: skip
    assert r.returncode == 1 and "refused" in r.stdout, r.stdout + r.stderr
    assert "\x1b" not in r.stdout + r.stderr and "\x07" not in r.stdout


# ---- the desktop's own limits --------------------------------------------------------------------


def _healthy() -> dict[str, Any]:
    return {"schema": "alma.health/1", "status": "OK", "time": R.now(),
            "checks": [{"name": "thermal", "status": "OK", "summary": "50 C"}]}  # fmt: skip


def _healthy_board(calls: list[tuple[str, float]]) -> Callable[..., RemoteResult]:
    """A board that updates and comes back healthy, answering each command as alma-ota does."""
    state = {"slot": "a", "boot": "boot-1"}

    def remote(node: Node, command: str, _cfg: Any, *, timeout: float, **_: Any) -> RemoteResult:
        calls.append((command, timeout))
        if "health" in command:
            return said(json.dumps(_healthy()))
        sub = command.split()[1]
        if sub == "status":
            pend = {"run": "x", "slot": "b", "from": "a"} if state["slot"] == "b" else None
            return said(json.dumps({**GOOD_STATUS, "current_slot": state["slot"], "boot_id": state["boot"],
                                    "pending": pend}))  # fmt: skip
        if sub == "install":
            return said(json.dumps({"slot": "b", "from": "a"}))
        if sub == "reboot":
            state.update(slot="b", boot="boot-2")
            return said('{"rebooting": true}')
        if sub == "commit":
            return said(json.dumps({"committed": "b"}))
        return said("{}")

    return remote


def _ctx(tmp: Path, swu: Path, remote: Callable[..., RemoteResult], **opts: Any) -> E.Context:
    fleet = Fleet(tmp / "fleet.toml", (Node("b1", "b1", "board"),))
    o = E.Options(canary=0, batch=1, boot_timeout=30, poll_s=0.01, **opts)
    info = read_swu(swu)
    return E.Context(fleet=fleet, swu=swu, info=info, opts=o, root=tmp / "records", run=E.run_id(info), remote=remote)


def test_every_health_call_is_bounded_by_the_health_timeout(tmp_path: Path, swu: Path) -> None:
    calls: list[tuple[str, float]] = []
    report = E.run_update(_ctx(tmp_path, swu, _healthy_board(calls), health_timeout=7), [Node("b1", "b1", "board")])
    assert report.records[0].result == R.COMMITTED, report.records[0]
    health = [t for c, t in calls if "health" in c]
    assert health and all(t <= 7 for t in health), health  # never the fixed 120 s step timeout


def test_records_dir_full_after_install_is_a_clear_error_and_the_board_is_left_alone(
    tmp_path: Path, swu: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The desktop cannot write its record once the board installed: exit 2 naming the dir,
    no traceback, and no further command to the board (it settles by itself: docs/ota.md)."""
    import errno

    calls: list[tuple[str, float]] = []
    real_save = R.save

    def save(root: Path, rec: R.UpdateRecord) -> Path:
        if any(p.name == "install" and p.result == "ok" for p in rec.phases):
            raise OSError(errno.ENOSPC, "No space left on device", str(root))
        return real_save(root, rec)

    monkeypatch.setattr(R, "save", save)
    with pytest.raises(E.RecordsUnwritable) as exc:
        E.run_update(_ctx(tmp_path, swu, _healthy_board(calls), health_timeout=7), [Node("b1", "b1", "board")])
    assert exc.value.exit_code == 2 and "No space left on device" in exc.value.message
    assert str(tmp_path / "records") in exc.value.message and "settles" in (exc.value.hint or "")
    assert [c.split()[1] for c, _ in calls if c.startswith("alma-ota")][-1] == "install"  # nothing after


def test_a_cut_push_is_resumed_at_the_offset_the_board_reports(tmp_path: Path, swu: Path) -> None:
    """The board holds 40000 bytes of this run's push: only the rest is sent, from that offset."""
    import os

    seen: dict[str, Any] = {}

    def remote(node: Node, command: str, _cfg: Any, **kw: Any) -> RemoteResult:
        sub = command.split()[1] if command.startswith("alma-ota") else "health"
        if sub == "status":
            return said(json.dumps({**GOOD_STATUS, "lock": {"run": "run-x", "host": "me"},
                                    "received": {"run": "run-x", "bytes": 40_000, "complete": False}}))  # fmt: skip
        if sub == "receive":
            seen["command"] = command
            seen["position"] = os.lseek(kw["run"].keywords["stdin"], 0, os.SEEK_CUR)
            return said('{"error": "stop here"}', rc=4)
        return said(json.dumps(_healthy()) if sub == "health" else '{"lock": {}, "resumed": true}')

    ctx = _ctx(tmp_path, swu, remote, health_timeout=7)
    ctx.run = "run-x"
    E.run_update(ctx, [Node("b1", "b1", "board")])
    assert "--offset 40000" in seen["command"] and seen["position"] == 40_000, seen
