"""`alma update` end to end: real sshd per simulated board, real SWUpdate, real alma-health.

The 4-board run of docs/ota.md's "Must show": canary 1, then a wave of 3 where one board
fails health on the new slot: it is rolled back, the others are committed, exit 1.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support_update import Lab, SimBoard, alma, load_state, make_swu, records

from alma.update import records as R
from alma.update.swu import read_swu

REPO = Path(__file__).resolve().parents[2]
# the health window bounds every health call (a loaded host needs seconds per call); a healthy
# board ends it at its first OK report, a sick one waits it out
FAST = ["--poll", "0.1", "--boot-timeout", "60", "--health-timeout", "15"]


@pytest.mark.slow
def test_four_boards_in_waves_one_fails_health_and_is_rolled_back(
    tmp_path: Path, signer: tuple[bytes, bytes], lab_factory: Callable[..., Lab]
) -> None:
    lab = lab_factory(["b1", "b2", "b3", "b4"])
    lab.boards["b3"].set(sick=True)
    swu = make_swu(tmp_path, signer)
    r = alma(tmp_path, "update", str(swu), "--fleet", str(lab.fleet), "--canary", "1", "--batch", "3", "--json", *FAST)
    assert r.returncode == 1, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["waves"] == [["b1"], ["b2", "b3", "b4"]]
    by = {b["node"]: b for b in out["boards"]}
    assert {n: b["result"] for n, b in by.items()} == {
        "b1": "COMMITTED",
        "b2": "COMMITTED",
        "b3": "ROLLED_BACK",
        "b4": "COMMITTED",
    }
    assert "health CRITICAL" in by["b3"]["reason"] and "thermal" in by["b3"]["reason"]
    for n in ("b1", "b2", "b4"):
        st = load_state(lab.boards[n].root)["rootfs"]
        assert st["current"] == 1 and st["successful"][1] is True  # committed on B
        assert (lab.boards[n].root / "etc/alma-release").read_text().count("1.1.0") == 1
    st = load_state(lab.boards["b3"].root)["rootfs"]
    assert st["current"] == 0 and st["active"] == 0 and st["slots"][1]["status"] == "unbootable"
    # records on disk say the same, with phases and the remote log
    recs = records(tmp_path, swu)
    assert recs["b3"].result == R.ROLLED_BACK and [p.name for p in recs["b3"].phases][-4:] == [
        "rollback",
        "reboot",
        "wait",
        "rollback",
    ]
    assert [p.name for p in recs["b1"].phases] == [
        "check",
        "lock",
        "push",
        "install",
        "reboot",
        "wait",
        "health",
        "commit",
    ]
    assert all(p.duration_s is not None for p in recs["b1"].phases)
    assert (
        (R.campaign_dir(tmp_path / "state/alma/update", read_swu(swu).sha256) / "b1.log").read_text().count("alma-ota")
    )
    # the board locks are released: a second run finds nothing to do but b3 (final: kept)
    r2 = alma(tmp_path, "update", str(swu), "--fleet", str(lab.fleet), "--json", *FAST)
    assert json.loads(r2.stdout)["boards"][2]["result"] == "ROLLED_BACK"
    assert {b["result"] for b in json.loads(r2.stdout)["boards"]} == {"COMMITTED", "ROLLED_BACK"}


@pytest.mark.slow
def test_canary_failure_stops_the_later_waves(
    tmp_path: Path, signer: tuple[bytes, bytes], lab_factory: Callable[..., Lab]
) -> None:
    lab = lab_factory(["c1", "c2"])
    lab.boards["c1"].set(sick=True)
    swu = make_swu(tmp_path, signer)
    plan = alma(tmp_path, "update", str(swu), "--fleet", str(lab.fleet), "--dry-run", "--json")
    assert plan.returncode == 0, plan.stderr
    rows = json.loads(plan.stdout)["plan"]
    assert [(r["wave"], r["node"], r["action"], r["current_slot"], r["target_slot"]) for r in rows] == [
        (1, "c1", "update", "a", "b"), (2, "c2", "update", "a", "b")]  # fmt: skip
    assert rows[0]["capsule"] == "none in the .swu" and rows[0]["running"] == "1.0.0"
    assert not (tmp_path / "state/alma/update").exists()  # a dry run writes nothing
    r = alma(tmp_path, "update", str(swu), "--fleet", str(lab.fleet), "--json", *FAST)
    assert r.returncode == 1, r.stderr
    by = {b["node"]: b for b in json.loads(r.stdout)["boards"]}
    assert by["c1"]["result"] == "ROLLED_BACK" and by["c2"]["result"] == "SKIPPED"
    assert load_state(lab.boards["c2"].root)["rootfs"]["current"] == 0  # untouched


@pytest.mark.slow
def test_new_slot_that_never_boots_falls_back_by_the_bootloader(
    tmp_path: Path, signer: tuple[bytes, bytes], lab_factory: Callable[..., Lab]
) -> None:
    lab = lab_factory(["h1"], hang_s=0.2)
    swu = make_swu(tmp_path, signer, boots=False)
    r = alma(tmp_path, "update", str(swu), "--fleet", str(lab.fleet), "--json", *FAST)
    assert r.returncode == 1, r.stdout + r.stderr
    [b] = json.loads(r.stdout)["boards"]
    assert b["result"] == "ROLLED_BACK" and "bootloader fell back to slot a" in b["reason"]
    st = load_state(lab.boards["h1"].root)
    assert st["rootfs"]["current"] == 0 and st["rootfs"]["slots"][1]["status"] == "unbootable"


@pytest.mark.slow
def test_board_that_never_comes_back_is_lost_then_resumed(
    tmp_path: Path, signer: tuple[bytes, bytes], lab_factory: Callable[..., Lab]
) -> None:
    lab = lab_factory(["d1"])
    board = lab.boards["d1"]
    board.dead = True
    swu = make_swu(tmp_path, signer)
    r = alma(tmp_path, "update", str(swu), "--fleet", str(lab.fleet), "--json", "--poll", "0.1", "--boot-timeout", "2")
    assert r.returncode == 4, r.stdout + r.stderr
    [b] = json.loads(r.stdout)["boards"]
    assert b["result"] == "LOST" and "did not come back within 2 s" in b["reason"]
    # fleet health shows it as mid-update, not CRITICAL
    h = alma(tmp_path, "fleet", "health", "--fleet", str(lab.fleet), "--json", "--no-save", "--timeout", "3")
    node = json.loads(h.stdout)["nodes"][0]
    assert node["status"] == "WARNING" and "mid-update" in node["summary"]
    # the operator power-cycles it; the same command resumes and commits
    board.dead = False
    board.power_on()
    r = alma(tmp_path, "update", str(swu), "--fleet", str(lab.fleet), "--json", *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["boards"][0]["result"] == "COMMITTED"


@pytest.mark.slow
def test_sigint_mid_update_then_resume_commits(
    tmp_path: Path, signer: tuple[bytes, bytes], lab_factory: Callable[..., Lab]
) -> None:
    lab = lab_factory(["s1"], down_s=1.5)
    swu = make_swu(tmp_path, signer)
    env = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "state")}
    p = subprocess.Popen(
        [sys.executable, "-m", "alma", "update", str(swu), "--fleet", str(lab.fleet), *FAST],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not load_state(lab.boards["s1"].root).get("reboot_requested"):
        time.sleep(0.02)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 130, err
    rec = records(tmp_path, swu)["s1"]
    assert rec.result == R.INTERRUPTED
    assert load_state(lab.boards["s1"].root)["rootfs"]["successful"][1] is False  # nothing committed
    r = alma(tmp_path, "update", str(swu), "--fleet", str(lab.fleet), "--json", *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["boards"][0]["result"] == "COMMITTED"
    assert load_state(lab.boards["s1"].root)["rootfs"]["successful"][1] is True


def _back_up(board: SimBoard, deadline_s: float = 300) -> None:
    """Wait until the simulated board has booted again and its sshd accepts connections."""
    import socket

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        st = load_state(board.root)
        sshd = board.sshd
        if not st.get("power_cut") and not st.get("reboot_requested") and sshd.proc.poll() is None:
            with socket.socket() as s, contextlib.suppress(OSError):
                s.settimeout(5)
                s.connect(("127.0.0.1", sshd.port))
                return
        time.sleep(0.1)
    raise AssertionError("the board did not come back")


def test_power_loss_during_the_rootfs_write_then_the_same_command_finishes(
    tmp_path: Path, signer: tuple[bytes, bytes], lab_factory: Callable[..., Lab]
) -> None:
    """FAILED (or LOST) is not final: the same command tries the board again and commits."""
    lab = lab_factory(["w1"])
    lab.boards["w1"].set(fault="power-loss-install")  # the power goes while SWUpdate writes slot b
    swu = make_swu(tmp_path, signer)
    r = alma(tmp_path, "update", str(swu), "--fleet", str(lab.fleet), "--json", *FAST)
    [b] = json.loads(r.stdout)["boards"]
    assert b["result"] in ("FAILED", "LOST") and b["phases"][-1]["name"] == "install", b
    assert load_state(lab.boards["w1"].root)["rootfs"]["current"] == 0  # the old slot, unchanged
    _back_up(lab.boards["w1"])  # the operator runs it again once the board is back
    r = alma(tmp_path, "update", str(swu), "--fleet", str(lab.fleet), "--json", *FAST)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["boards"][0]["result"] == "COMMITTED"
    assert not (lab.boards["w1"].root / "data/alma-ota/lock.json").exists()


def test_a_second_desktop_of_the_same_name_is_refused_busy_naming_the_holder(
    tmp_path: Path, signer: tuple[bytes, bytes], lab_factory: Callable[..., Lab]
) -> None:
    """Desktop 1 (this host, this user) holds the board mid-update; desktop 2 with the same
    hostname and user runs the same .swu: refused busy, naming desktop 1's run; never 'resumed'."""
    from alma.update import engine as E

    lab = lab_factory(["m1"])
    board = lab.boards["m1"]
    swu = make_swu(tmp_path, signer)
    first = E.run_id(read_swu(swu))
    env = {**os.environ, "ALMA_OTA_ROOT": str(board.root), "PATH": f"{board.root / 'bin'}:{os.environ['PATH']}"}
    subprocess.run([sys.executable, str(REPO / "tools/ota/alma-ota"), "begin", "--run", first, "--host", "desk"],
                   env=env, check=True, capture_output=True, timeout=600)  # fmt: skip
    r = alma(tmp_path, "update", str(swu), "--fleet", str(lab.fleet), "--json", *FAST)
    assert r.returncode == 1, r.stdout + r.stderr
    [b] = json.loads(r.stdout)["boards"]
    assert b["result"] == "FAILED" and f"board busy: update run {first} from desk" in b["reason"], b
    assert [p["name"] for p in b["phases"]] == ["check"]  # nothing pushed into the holder's file
    # the holder died: the operator lets the board go, and the same command then updates it
    a = alma(tmp_path, "update", "--abort", "m1", "--fleet", str(lab.fleet), "--json")
    assert a.returncode == 0 and json.loads(a.stdout)["aborted"][0]["released"] == first, a.stdout + a.stderr
    r = alma(tmp_path, "update", str(swu), "--fleet", str(lab.fleet), "--json", *FAST)
    assert r.returncode == 0 and json.loads(r.stdout)["boards"][0]["result"] == "COMMITTED", r.stdout + r.stderr


def test_abort_undoes_an_installed_uncommitted_update(
    tmp_path: Path, signer: tuple[bytes, bytes], lab_factory: Callable[..., Lab]
) -> None:
    lab = lab_factory(["x1"])
    board = lab.boards["x1"]
    swu = make_swu(tmp_path, signer)
    data = swu.read_bytes()
    env = {**os.environ, "ALMA_OTA_ROOT": str(board.root), "PATH": f"{board.root / 'bin'}:{os.environ['PATH']}"}
    ota = [sys.executable, str(REPO / "tools/ota/alma-ota")]
    for args, stdin in ((["begin", "--run", "dead"], b""), (["receive", "--run", "dead", "--sha256",
                        hashlib.sha256(data).hexdigest(), "--size", str(len(data))], data),
                        (["install", "--run", "dead"], b"")):  # fmt: skip
        subprocess.run([*ota, *args], env=env, input=stdin, check=True, capture_output=True, timeout=600)
    board.reboot()  # into the new slot; nobody will judge it
    assert load_state(board.root)["rootfs"]["current"] == 1
    a = alma(tmp_path, "update", "--abort", "x1", "--fleet", str(lab.fleet), "--json")
    assert a.returncode == 0, a.stdout + a.stderr
    row = json.loads(a.stdout)["aborted"][0]
    assert row["released"] == "dead" and row["rebooting"] is True
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (board.root / "data/alma-ota/pending.json").exists():
        time.sleep(0.1)  # the supervisor reboots it; settle at boot finishes the rollback
    st = load_state(board.root)["rootfs"]
    assert st["current"] == 0 and st["successful"][0] is True and st["slots"][1]["status"] == "unbootable"
    assert not (board.root / "data/alma-ota/lock.json").exists()
