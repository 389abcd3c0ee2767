"""The update settles on the board's truth: what the board runs, on which boot, is checked at
every judgement (real sshd, real SWUpdate, the simulated A/B board of tests/support_update.py,
the engine in-process so a test can act at a phase's start)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support_swu import build_swu
from support_update import AGENT, MACHINE, Lab, SimBoard, load_state, require_swupdate, rootfs_image, save_state

from alma.fleet.inventory import load_fleet
from alma.update import engine as E
from alma.update import records as R
from alma.update.swu import read_swu


def _ctx(lab: Lab, swu: Path, root: Path, **opts: float) -> E.Context:
    info = read_swu(swu)
    o = E.Options(canary=0, batch=1, boot_timeout=60, health_timeout=60, poll_s=0.1)
    for k, v in opts.items():
        setattr(o, k, v)
    return E.Context(fleet=load_fleet(lab.fleet), swu=swu, info=info, opts=o, root=root, run=E.run_id(info))


def _swu(tmp: Path, signer: tuple[bytes, bytes]) -> Path:
    img = rootfs_image(tmp / "r.ext4", "1.1.0")
    out = tmp / "u.swu"
    build_swu(out, machine=MACHINE, version="1.1.0", rootfs=img, cert_pem=signer[0], key_pem=signer[1], root="")
    return out


def test_a_fallback_during_the_health_window_is_rolled_back_with_the_truth(
    tmp_path: Path, signer: tuple[bytes, bytes], lab_factory: Callable[..., Lab]
) -> None:
    """The new slot fails on this board's hardware; while its health is judged, the board
    resets until the bootloader gives up on the slot and boots the old one, which is healthy.
    The verdict must not be the old slot's: ROLLED_BACK, the record says it fell back, the
    board's lock and pending update are gone and the old slot is marked good."""
    lab = lab_factory(["g1"])
    board = lab.boards["g1"]
    board.set(sick=True)
    swu = _swu(tmp_path, signer)
    ctx = _ctx(lab, swu, tmp_path / "records")

    def on_event(node: str, what: str) -> None:
        if what == "health":  # the retries run out: the bootloader marks slot b unbootable, boots a
            board.power_off()
            st = load_state(board.root)
            st["rootfs"]["slots"][1]["retry_count"] = 0
            save_state(board.root, st)
            board.power_on()

    ctx.on_event = on_event
    [rec] = E.run_update(ctx, [n for n in load_fleet(lab.fleet).nodes if n.name == "g1"]).records
    assert rec.result == R.ROLLED_BACK, rec
    assert "fell back during the health check" in (rec.reason or "") and "on slot a" in (rec.reason or ""), rec.reason
    st = load_state(board.root)["rootfs"]
    assert st["current"] == 0 and st["successful"][0] is True
    assert not (board.root / "data/alma-ota/lock.json").exists()
    assert not (board.root / "data/alma-ota/pending.json").exists()


# ---- the board's own state machine, driven through the real agent (no desktop) ------------------

RUN = "run1"


def agent(b: SimBoard, *args: str, stdin: bytes | None = None) -> tuple[int, dict[str, Any]]:
    env = {**os.environ, "ALMA_OTA_ROOT": str(b.root), "PATH": f"{b.root / 'bin'}:{os.environ['PATH']}"}
    r = subprocess.run([sys.executable, str(AGENT), *args], input=stdin or b"", capture_output=True, env=env,
                       timeout=600)  # fmt: skip
    return r.returncode, json.loads(r.stdout.decode().strip().splitlines()[-1])


def _age(b: SimBoard, name: str, **fields: str) -> None:
    """Time passing on the board, without waiting for it: the named state file's stamps moved."""
    p = b.root / "data/alma-ota" / name
    p.write_text(json.dumps({**json.loads(p.read_text()), **fields}))


LONG_AGO = "2000-01-01T00:00:00Z"


def test_a_dead_runs_lock_is_a_lease_that_lapses_and_a_live_one_is_busy_naming_its_holder(
    tmp_path: Path, signer: tuple[bytes, bytes]
) -> None:
    require_swupdate()
    board = SimBoard(tmp_path / "boards", "l1", signer[0])
    assert agent(board, "begin", "--run", "run-a", "--host", "desk-a")[0] == 0
    rc, out = agent(board, "begin", "--run", "run-b", "--host", "desk-b")
    assert rc == 3 and "run-a from desk-a" in out["error"] and "lease until" in out["error"], out
    _age(board, "lock.json", expires=LONG_AGO)  # run-a died an hour ago, before installing
    rc, out = agent(board, "begin", "--run", "run-b", "--host", "desk-b")
    assert rc == 0 and out["lock"]["run"] == "run-b", out
    _age(board, "lock.json", expires=LONG_AGO)
    assert agent(board, "settle")[1]["settled"] == "released an expired lease"  # by itself, at boot or by timer
    assert not (board.root / "data/alma-ota/lock.json").exists()


def test_a_cut_push_goes_on_at_the_offset_the_board_has(tmp_path: Path, signer: tuple[bytes, bytes]) -> None:
    require_swupdate()
    board = SimBoard(tmp_path / "boards", "p1", signer[0])
    data = _swu(tmp_path, signer).read_bytes()
    sha, size = hashlib.sha256(data).hexdigest(), str(len(data))
    assert agent(board, "begin", "--run", RUN)[0] == 0
    rc, out = agent(board, "receive", "--run", RUN, "--sha256", sha, "--size", size, stdin=data[:40_000])
    assert rc == 4 and "cut short: 40000" in out["error"]
    got = agent(board, "status")[1]["received"]
    assert got == {"run": RUN, "bytes": 40_000, "complete": False}
    rc, out = agent(board, "receive", "--run", RUN, "--sha256", sha, "--size", size, "--offset", "40000",
                    stdin=data[40_000:])  # fmt: skip
    assert rc == 0 and out["resumed_at"] == 40_000, out
    rc, out = agent(board, "install", "--run", RUN)
    assert rc == 0 and out["slot"] == "b", out


def test_an_unjudged_new_slot_is_rolled_back_by_the_board_itself(tmp_path: Path, signer: tuple[bytes, bytes]) -> None:
    """The desktop went away after the reboot: no verdict comes. Past its verifying deadline,
    with no live lease, the board rolls back by itself and marks the old slot good."""
    require_swupdate()
    board = SimBoard(tmp_path / "boards", "v1", signer[0])
    data = _swu(tmp_path, signer).read_bytes()
    assert agent(board, "begin", "--run", RUN)[0] == 0
    assert agent(board, "receive", "--run", RUN, "--sha256", hashlib.sha256(data).hexdigest(), "--size",
                 str(len(data)), stdin=data)[0] == 0  # fmt: skip
    assert agent(board, "install", "--run", RUN)[0] == 0
    assert agent(board, "settle")[1]["settled"] == "installed; the reboot into it is next"
    board.power_on()  # boots the new slot; its settle starts the verifying clock
    assert load_state(board.root)["rootfs"]["current"] == 1
    assert agent(board, "settle")[1]["settled"] == "verifying"
    _age(board, "pending.json", verifying_since=LONG_AGO)
    _age(board, "lock.json", expires=LONG_AGO)
    rc, out = agent(board, "settle")
    assert rc == 0 and out["rebooting"] is True, out
    board.poll()  # the reboot it asked for; settle runs again at boot
    st = load_state(board.root)["rootfs"]
    assert st["current"] == 0 and st["successful"][0] is True and st["slots"][1]["status"] == "unbootable"
    assert json.loads((board.root / "data/alma-ota/last.json").read_text())["result"] == "ROLLED_BACK"
    assert not (board.root / "data/alma-ota/lock.json").exists()
    for _ in range(5):
        assert board.boot() and load_state(board.root)["rootfs"]["current"] == 0
