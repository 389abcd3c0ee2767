"""The hawkBit path as the image ships it: ``alma build``'s swupdate.cfg and alma-ota's recipe
(its conf.d words for meta-swupdate's launcher) installed on a board, the REAL SWUpdate daemon
started by the real launcher with nothing passed by hand, polling a DDI stand-in
(tests/support_hawkbit.py) and installing into the inactive slot only what the fleet signed."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support_board import run_shell_function
from support_hawkbit import URL, run_daemon
from support_swu import DESCRIPTION, Payload, build_swu, description, pack, sha256_file
from support_update import AGENT, MACHINE, SimBoard, agent, load_state, make_cert, rootfs_image

from alma.imagebuild import ota

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "layers/meta-alma/recipes-alma/alma-ota/alma-ota_0.1.0.bb"
TENANT, DEVICE = "lab_7", "orin-07"
# A refused .swu must be larger than SWUpdate's IPC socket buffers (as every real image is): a
# file that fits in them is streamed whole before the installer refuses it, and SWUpdate
# 2022.12's suricatta, asking the status before the installer started (still IDLE), counted
# it installed and told hawkBit "All Chunks Installed" (seen once in 10 parallel runs;
# ipc_wait_for_complete returns last_result IDLE). The slot stayed untouched all the same.
REFUSED_BYTES = 4 << 20


def _image_board(tmp: Path, signer: tuple[bytes, bytes]) -> SimBoard:
    """A board whose /etc is what the image installs: alma build's swupdate.cfg (for this
    hawkBit URL and tenant) and alma-ota's do_install run as bitbake would, its name written
    by the flash-time identity hook."""
    board = SimBoard(tmp / "boards", DEVICE, signer[0])
    (tmp / "ota-cert.pem").write_bytes(signer[0])
    cfg = tmp / ota.CFG_NAME  # what alma build writes for [ota] hawkbit_url (src/alma/imagebuild/plan.py)
    cfg.write_text(ota.suricatta_config(ota.OtaSettings(cert=tmp / "ota-cert.pem", hawkbit_url=URL, tenant=TENANT,
                                                        poll_s=10)))  # fmt: skip
    run_shell_function(RECIPE, "do_install:append", {
        "D": str(board.root), "S": str(REPO / "tools/ota"), "MACHINE": MACHINE,
        "ALMA_OTA_CERT": str(tmp / "ota-cert.pem"), "ALMA_OTA_SWUPDATE_CFG": str(cfg),
        "ALMA_OTA_STATE_DIR": "/data/alma-ota", "ALMA_OTA_LOWEST_BOOTLOADER": "36.4.0"})  # fmt: skip
    (board.root / "etc/hostname").write_text(f"{DEVICE}\n")
    return board


def _slot_b(board: SimBoard) -> bytes:
    return (board.root / "dev/disk/by-partlabel/APP_b").read_bytes()


def _finished(out: dict[str, object]) -> list[str]:
    return [str(f.get("status", {}).get("result", {}).get("finished")) for f in out["feedback"]]  # type: ignore[attr-defined]


def test_the_images_config_polls_hawkbit_and_installs_a_signed_swu_into_the_inactive_slot(
    tmp_path: Path, signer: tuple[bytes, bytes]
) -> None:
    board = _image_board(tmp_path, signer)
    img = rootfs_image(tmp_path / "rootfs.ext4", "1.1.0")
    swu = build_swu(tmp_path / "alma-1.1.0.swu", machine=MACHINE, version="1.1.0", rootfs=img,
                    cert_pem=signer[0], key_pem=signer[1], root="")  # fmt: skip
    out = run_daemon(tmp_path, board.root, swu, tenant=TENANT, device=DEVICE, version="1.1.0")
    assert out["done"], out
    assert f"/{TENANT}/controller/v1/{DEVICE}" in out["paths"], out["paths"]  # the board's own id
    assert "failure" not in _finished(out), out
    details = json.dumps(out["feedback"])
    assert "All Chunks Installed" in details, out
    data = img.read_bytes()
    assert _slot_b(board)[: len(data)] == data, out["log"][-3000:]  # the inactive slot, whole
    running = (board.root / "dev/disk/by-partlabel/APP").read_bytes()
    assert running[:40].startswith(b'{"alma-sim": {"version": "1.0.0"'), "the running slot was written"


def test_an_unsigned_swu_from_hawkbit_is_refused_and_nothing_is_written(
    tmp_path: Path, signer: tuple[bytes, bytes]
) -> None:
    board = _image_board(tmp_path, signer)
    img = rootfs_image(tmp_path / "rootfs.ext4", "1.1.0", size=REFUSED_BYTES)
    desc = description(machine=MACHINE, version="1.1.0", root="",
                       payloads=[Payload("rootfs.ext4", "rootfs", sha256_file(img), img.stat().st_size)])  # fmt: skip
    swu = pack(tmp_path / "unsigned.swu", [(DESCRIPTION, desc), ("rootfs.ext4", img)])
    before = _slot_b(board)
    out = run_daemon(tmp_path, board.root, swu, tenant=TENANT, device=DEVICE, version="1.1.0")
    assert out["done"] and "failure" in _finished(out), (out["feedback"], out["log"][-4000:])
    assert "instead of sw-description.sig" in out["log"], out["log"][-3000:]  # SWUpdate wants the signature next
    assert _slot_b(board) == before


@pytest.mark.parametrize(
    ("signed_by", "version", "why"),
    [("attacker", "1.1.0", "Authentication of all signatures failed"),
     ("fleet", "0.9.0", "No downgrading allowed: new version 0.9.0")],  # the board runs 1.0.0
)  # fmt: skip
def test_another_signer_and_an_older_version_are_refused_through_hawkbit_too(
    tmp_path: Path, signer: tuple[bytes, bytes], signed_by: str, version: str, why: str
) -> None:
    """The daemon's gate is alma-ota's (one list): the baked-in certificate and -N running."""
    board = _image_board(tmp_path, signer)
    before = _slot_b(board)
    key = make_cert(tmp_path / "other", "attacker") if signed_by == "attacker" else signer
    img = rootfs_image(tmp_path / "rootfs.ext4", version, size=REFUSED_BYTES)
    swu = build_swu(tmp_path / "u.swu", machine=MACHINE, version=version, rootfs=img,
                    cert_pem=key[0], key_pem=key[1], root="")  # fmt: skip
    out = run_daemon(tmp_path, board.root, swu, tenant=TENANT, device=DEVICE, version=version)
    assert out["done"] and "failure" in _finished(out), out
    assert why in out["log"], out["log"][-3000:]
    assert _slot_b(board) == before


@pytest.mark.parametrize(
    ("path", "text", "why"),
    [
        # a board that cannot say who it is never polls under another's id (nor a made-up one)
        ("etc/hostname", "-bad-\n", r"swupdate-args --suricatta failed"),
        # the launcher splits SWUPDATE_ARGS at spaces: a running version that would smuggle in
        # another certificate (-k) stops the daemon instead of reaching SWUpdate's command line
        ("etc/alma-release", 'ID=alma\nVERSION_ID="1.0.0 -k /etc/planted.pem"\n',
         r"swupdate-args failed.*cannot hand '1\.0\.0 -k /etc/planted\.pem'"),
    ],
    ids=["no board name", "a word the launcher would split"],
)  # fmt: skip
def test_the_daemon_does_not_start_on_what_it_cannot_say_safely(
    tmp_path: Path, signer: tuple[bytes, bytes], path: str, text: str, why: str
) -> None:
    board = _image_board(tmp_path, signer)
    (board.root / path).write_text(text)
    img = rootfs_image(tmp_path / "rootfs.ext4", "1.1.0")
    swu = build_swu(tmp_path / "u.swu", machine=MACHINE, version="1.1.0", rootfs=img,
                    cert_pem=signer[0], key_pem=signer[1], root="")  # fmt: skip
    out = run_daemon(tmp_path, board.root, swu, tenant=TENANT, device=DEVICE, version="1.1.0")
    assert not out["done"] and out["exited"] not in (None, 0) and out["paths"] == [], out
    assert re.search(why, out["log"]), out["log"]


# ---- the board settles what the daemon installed -----------------------------------------------

STATE = "data/alma-ota"


def _installed_by_hawkbit(tmp: Path, board: SimBoard, signer: tuple[bytes, bytes], version: str,
                          **img: Any) -> dict[str, Any]:  # fmt: skip
    """The image's daemon installs ``version`` from hawkBit; its hooks hand it to the agent,
    which switches the boot slot and asks for the reboot (the sim's ``reboot`` records it)."""
    image = rootfs_image(tmp / f"rootfs-{version}.ext4", version, **img)
    swu = build_swu(tmp / f"alma-{version}.swu", machine=MACHINE, version=version, rootfs=image,
                    cert_pem=signer[0], key_pem=signer[1], root="")  # fmt: skip
    until = {"path": str(board.root / "sim/uefi.json"), "text": '"reboot_requested": true'}
    out = run_daemon(tmp, board.root, swu, tenant=TENANT, device=DEVICE, version=version, until=until)
    assert out["done"] and "All Chunks Installed" in json.dumps(out["feedback"]), out["log"][-3000:]
    assert load_state(board.root)["reboot_requested"], out["log"][-4000:]
    return out


def _last(board: SimBoard) -> dict[str, Any]:
    got: dict[str, Any] = json.loads((board.root / STATE / "last.json").read_text())
    return got


def _age_verifying(board: SimBoard) -> None:
    """The verifying window passed, without waiting for it: the pending update's stamp moved."""
    p = board.root / STATE / "pending.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), "verifying_since": "2000-01-01T00:00:00Z"}))


def test_a_hawkbit_install_is_switched_rebooted_judged_and_committed_by_the_board(
    tmp_path: Path, signer: tuple[bytes, bytes]
) -> None:
    board = _image_board(tmp_path, signer)
    _, before = agent(board, "status")
    _installed_by_hawkbit(tmp_path, board, signer, "1.1.0")
    rc, st = agent(board, "status")
    pend = st["pending"]
    assert (pend["run"], pend["slot"], pend["from"], pend["version"]) == ("hawkbit", "b", "a", "1.1.0"), st
    assert pend["boot"] == before["boot_id"] and pend["judge"] == "board", st  # the running slot's boot
    assert load_state(board.root)["rootfs"]["active"] == 1
    assert not (board.root / STATE / "hawkbit.swu").exists()  # the daemon's copy, read and dropped
    # never two updates at once: an alma update run is refused while the daemon's holds the board
    rc, out = agent(board, "begin", "--run", "desk-1", "--host", "desk")
    assert rc == 3 and "update run hawkbit from the hawkBit daemon" in out["error"], out
    board.reboot()  # a fresh boot on the new slot; settle (the boot unit) judges its health
    rc, st = agent(board, "status")
    assert (st["current_slot"], st["version"], st["lock"], st["pending"]) == ("b", "1.1.0", None, None), st
    assert st["last"]["result"] == "COMMITTED" and "committed by the board" in st["last"]["why"], st
    assert load_state(board.root)["rootfs"]["successful"] == [True, True]


def test_a_sick_image_from_hawkbit_is_rolled_back_by_the_board_and_the_old_slot_stays_good(
    tmp_path: Path, signer: tuple[bytes, bytes]
) -> None:
    board = _image_board(tmp_path, signer)
    _installed_by_hawkbit(tmp_path, board, signer, "1.1.0", health="critical")
    board.reboot()
    rc, st = agent(board, "status")
    assert st["current_slot"] == "b" and "health CRITICAL" in st["pending"]["verdict"], st  # within its window
    _age_verifying(board)
    rc, out = agent(board, "settle")
    assert rc == 0 and out["rebooting"] is True and "health CRITICAL" in out["why"], out
    board.poll()  # the reboot it asked for; at boot settle finishes the rollback
    rc, st = agent(board, "status")
    assert (st["current_slot"], st["version"], st["lock"], st["pending"]) == ("a", "1.0.0", None, None), st
    assert _last(board)["result"] == "ROLLED_BACK" and "health CRITICAL" in _last(board)["why"], _last(board)
    uefi = load_state(board.root)["rootfs"]
    assert uefi["successful"][0] is True and uefi["slots"][1]["status"] == "unbootable", uefi
    for _ in range(4):  # later power cycles keep booting the old slot
        board.reboot()
    assert load_state(board.root)["rootfs"]["current"] == 0


def test_a_power_cut_while_the_board_verifies_a_hawkbit_install_settles_by_itself(
    tmp_path: Path, signer: tuple[bytes, bytes]
) -> None:
    board = _image_board(tmp_path, signer)
    _installed_by_hawkbit(tmp_path, board, signer, "1.1.0")
    board.set(guard=False)  # the first boot's judgement finds the guard not up yet: still verifying
    board.reboot()
    rc, st = agent(board, "status")
    assert st["current_slot"] == "b" and "guard is not running" in st["pending"]["verdict"], st
    board.set(guard=True, power_cut=True)
    board.poll()  # the power goes and comes back: the bootloader retries the uncommitted slot
    rc, st = agent(board, "status")
    assert (st["current_slot"], st["version"], st["lock"], st["pending"]) == ("b", "1.1.0", None, None), st
    assert st["last"]["result"] == "COMMITTED", st
    assert load_state(board.root)["rootfs"]["successful"] == [True, True]


def test_a_hawkbit_install_is_refused_while_an_alma_update_run_holds_the_board(
    tmp_path: Path, signer: tuple[bytes, bytes]
) -> None:
    board = _image_board(tmp_path, signer)
    rc, out = agent(board, "begin", "--run", "desk-1", "--host", "desk")
    assert rc == 0, out
    before = _slot_b(board)
    img = rootfs_image(tmp_path / "rootfs.ext4", "1.1.0", size=REFUSED_BYTES)
    swu = build_swu(tmp_path / "u.swu", machine=MACHINE, version="1.1.0", rootfs=img,
                    cert_pem=signer[0], key_pem=signer[1], root="")  # fmt: skip
    out = run_daemon(tmp_path, board.root, swu, tenant=TENANT, device=DEVICE, version="1.1.0")
    assert out["done"] and "failure" in _finished(out), (out["feedback"], out["log"][-4000:])
    assert "board busy: update run desk-1 from desk" in out["log"], out["log"][-3000:]
    assert _slot_b(board) == before
    rc, st = agent(board, "status")
    assert st["lock"]["run"] == "desk-1" and st["pending"] is None, st
    assert not (board.root / STATE / "hawkbit.swu").exists()


def test_adopt_refuses_what_the_agents_reader_refuses_and_switches_nothing(
    tmp_path: Path, signer: tuple[bytes, bytes]
) -> None:
    """What the daemon installed is the agent's to judge: a copy its reader refuses (here made
    for another machine) is never switched to, and the daemon's lease is let go."""
    board = _image_board(tmp_path, signer)
    rc, out = agent(board, "claim")
    assert rc == 0 and out["lock"]["run"] == "hawkbit", out
    img = rootfs_image(tmp_path / "rootfs.ext4", "1.1.0")
    build_swu(board.root / STATE / "hawkbit.swu", machine="jetson-orin-nano-devkit", version="1.1.0", rootfs=img,
              cert_pem=signer[0], key_pem=signer[1], root="")  # fmt: skip
    rc, out = agent(board, "adopt")
    assert rc == 2 and "this .swu is for jetson-orin-nano-devkit" in out["error"], out
    rc, st = agent(board, "status")
    assert st["lock"] is None and st["pending"] is None and st["last"]["result"] == "FAILED", st
    assert load_state(board.root)["rootfs"]["active"] == 0 and not load_state(board.root)["reboot_requested"]


def test_the_hooks_leave_an_ssh_runs_own_install_alone(tmp_path: Path, signer: tuple[bytes, bytes]) -> None:
    """SWUpdate reads /etc/swupdate.cfg without -f, so ``alma-ota install``'s own ``swupdate -i``
    runs the daemon's hooks too, while install holds the agent's step lock: they answer at
    once and touch nothing (the ssh run switches and judges its install)."""
    board = _image_board(tmp_path, signer)
    rc, out = agent(board, "begin", "--run", "desk-1", "--host", "desk")
    assert rc == 0, out
    env = {**os.environ, "ALMA_OTA_ROOT": str(board.root), "ALMA_OTA_INSTALL": "desk-1"}
    with open(board.root / STATE / ".agent.lock", "a") as step:
        fcntl.flock(step, fcntl.LOCK_EX)  # as install holds it while its SWUpdate runs
        for hook in ("claim", "adopt"):
            r = subprocess.run([sys.executable, str(AGENT), hook], env=env, capture_output=True, text=True,
                               timeout=120)  # fmt: skip
            assert r.returncode == 0 and "is its own" in r.stdout, (hook, r.stdout, r.stderr)
    rc, st = agent(board, "status")
    assert st["lock"]["run"] == "desk-1" and st["pending"] is None, st
