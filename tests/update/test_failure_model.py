"""docs/ota.md's failure model, row by row, on a simulated board driven through the real agent
(alma-ota + the real SWUpdate; no ssh here: the e2e file covers the host side over sshd)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import DEADLINE_S
from support_swu import build_swu
from support_update import AGENT, MACHINE, SimBoard, kill_tree, load_state, require_swupdate, rootfs_image

RUN = "run1"


@pytest.fixture
def board(tmp_path: Path, signer: tuple[bytes, bytes]) -> SimBoard:
    require_swupdate()
    return SimBoard(tmp_path / "boards", "f1", signer[0])


def agent(b: SimBoard, *args: str, stdin: bytes | None = None) -> tuple[int, dict[str, object]]:
    env = {**os.environ, "ALMA_OTA_ROOT": str(b.root), "PATH": f"{b.root / 'bin'}:{os.environ['PATH']}"}
    r = subprocess.run(
        [sys.executable, str(AGENT), *args], input=stdin or b"", capture_output=True, env=env, timeout=600
    )
    return r.returncode, json.loads(r.stdout.decode().strip().splitlines()[-1])


def swu(tmp: Path, signer: tuple[bytes, bytes], version: str = "1.1.0", capsule: str | None = None) -> Path:
    img = rootfs_image(tmp / f"r-{version}.ext4", version)
    cap = None
    if capsule:
        cap = tmp / "tegra-bl.cap"
        cap.write_text(f"CAPSULE {capsule}")
    out = tmp / f"{version}.swu"
    build_swu(out, machine=MACHINE, version=version, rootfs=img, cert_pem=signer[0], key_pem=signer[1], root="",
              capsule=cap, capsule_version=capsule)  # fmt: skip
    return out


def push(b: SimBoard, f: Path) -> None:
    import hashlib

    data = f.read_bytes()
    assert agent(b, "begin", "--run", RUN)[0] == 0
    rc, out = agent(b, "receive", "--run", RUN, "--sha256", hashlib.sha256(data).hexdigest(), "--size", str(len(data)),
                    stdin=data)  # fmt: skip
    assert rc == 0, out


def test_power_loss_during_the_rootfs_write_boots_the_old_slot(tmp_path: Path, signer: tuple[bytes, bytes],
                                                               board: SimBoard) -> None:  # fmt: skip
    push(board, swu(tmp_path, signer))
    board.set(fault="power-loss-install")
    env = {**os.environ, "ALMA_OTA_ROOT": str(board.root), "PATH": f"{board.root / 'bin'}:{os.environ['PATH']}"}
    p = subprocess.Popen([sys.executable, str(AGENT), "install", "--run", RUN], env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + DEADLINE_S
    while not load_state(board.root).get("power_cut") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert load_state(board.root).get("power_cut"), "the install never reached the power cut"
    kill_tree(p.pid)  # the power goes
    p.wait()
    assert board.boot()
    st = load_state(board.root)["rootfs"]
    assert st["current"] == 0 and st["active"] == 0  # never switched: the old slot, unchanged
    assert 'VERSION_ID="1.0.0"' in (board.root / "etc/alma-release").read_text()


def test_power_loss_during_the_capsule_keeps_the_old_chain_and_slot(tmp_path: Path, signer: tuple[bytes, bytes],
                                                                    board: SimBoard) -> None:  # fmt: skip
    push(board, swu(tmp_path, signer, capsule="36.4.4"))
    rc, out = agent(board, "install", "--run", RUN)
    assert rc == 0 and out["capsule"]["armed"] is True, out  # type: ignore[index]
    board.set(fault="power-loss-capsule")
    assert board.boot()
    st = load_state(board.root)
    assert st["bootloader"]["version"] == "36.4.3" and st["bootloader"]["capsule_status"] == 3
    assert st["rootfs"]["current"] == 0  # the rootfs follows its paired (old) chain
    rc, out = agent(board, "rollback", "--run", RUN)  # what the host does when the board comes back on A
    assert rc == 0 and out["reboot_needed"] is False and agent(board, "status")[1]["lock"] is None


def test_capsule_same_version_or_below_lowest_is_not_armed(tmp_path: Path, signer: tuple[bytes, bytes],
                                                           board: SimBoard) -> None:  # fmt: skip
    push(board, swu(tmp_path, signer, capsule="36.4.3"))
    rc, out = agent(board, "install", "--run", RUN)
    assert rc == 0 and out["capsule"]["armed"] is False and "already" in out["capsule"]["why"]  # type: ignore[index]
    assert not (board.root / "boot/efi/EFI/UpdateCapsule/TEGRA_BL.Cap").exists()


def test_power_loss_between_reboot_and_commit_retries_then_falls_back(tmp_path: Path, signer: tuple[bytes, bytes],
                                                                      board: SimBoard) -> None:  # fmt: skip
    push(board, swu(tmp_path, signer))
    assert agent(board, "install", "--run", RUN)[0] == 0
    seen = []
    for _ in range(4):  # power cycles before anyone committed
        assert board.boot()
        seen.append(load_state(board.root)["rootfs"]["current"])
    assert seen == [1, 1, 1, 0]  # three tries of the new slot, then the bootloader falls back
    assert load_state(board.root)["rootfs"]["slots"][1]["status"] == "unbootable"


def test_older_version_is_refused_by_swupdate_and_nothing_switches(tmp_path: Path, signer: tuple[bytes, bytes],
                                                                   board: SimBoard) -> None:  # fmt: skip
    push(board, swu(tmp_path, signer, version="0.9.0"))
    rc, out = agent(board, "install", "--run", RUN)
    assert rc == 4 and "downgrad" in str(out["error"]).lower(), out
    assert load_state(board.root)["rootfs"]["active"] == 0


def test_an_older_version_installs_when_the_downgrade_is_asked_for(tmp_path: Path, signer: tuple[bytes, bytes],
                                                                   board: SimBoard) -> None:  # fmt: skip
    push(board, swu(tmp_path, signer, version="0.9.0"))
    rc, out = agent(board, "install", "--run", RUN, "--allow-downgrade")
    assert rc == 0 and out["slot"] == "b" and out["version"] == "0.9.0", out
    assert load_state(board.root)["rootfs"]["active"] == 1


def test_two_runs_at_once_the_second_is_refused_busy(board: SimBoard) -> None:
    assert agent(board, "begin", "--run", "run-a")[0] == 0
    rc, out = agent(board, "begin", "--run", "run-b")
    assert rc == 3 and "busy" in str(out["error"])
    assert agent(board, "begin", "--run", "run-a")[1]["resumed"] is True  # the owner resumes


def test_ssh_lost_mid_push_leaves_nothing_installable(board: SimBoard) -> None:
    assert agent(board, "begin", "--run", RUN)[0] == 0
    rc, out = agent(board, "receive", "--run", RUN, "--sha256", "0" * 64, "--size", "100000", stdin=b"x" * 4000)
    assert rc == 4 and "cut short: 4000 of 100000" in str(out["error"])
    assert not (board.root / "data/alma-ota/incoming.swu").exists()
    rc, out = agent(board, "install", "--run", RUN)
    assert rc == 2 and "nothing received" in str(out["error"])


def test_after_a_health_rollback_five_power_cycles_still_boot_the_old_slot(tmp_path: Path, signer: tuple[bytes, bytes],
                                                                           board: SimBoard) -> None:  # fmt: skip
    """The switch back (set-active-boot-slot while the new slot runs) clears the old slot's
    "successful" flag; unless it is marked good again its retry count runs out."""
    push(board, swu(tmp_path, signer))
    assert agent(board, "install", "--run", RUN)[0] == 0
    assert board.boot() and load_state(board.root)["rootfs"]["current"] == 1
    rc, out = agent(board, "rollback", "--run", RUN)  # health failed on the new slot
    assert rc == 0 and out["reboot_needed"] is True, out
    assert board.boot() and load_state(board.root)["rootfs"]["current"] == 0
    rc, out = agent(board, "rollback", "--run", RUN)  # back on the old slot: finish
    assert rc == 0 and out["reboot_needed"] is False, out
    seen = []
    for _ in range(5):
        assert board.boot()
        seen.append(load_state(board.root)["rootfs"]["current"])
    assert seen == [0] * 5
    assert load_state(board.root)["rootfs"]["successful"][0] is True
