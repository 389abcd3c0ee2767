"""The update settles on the board's truth: what the board runs, on which boot, is checked at
every judgement (real sshd, real SWUpdate, the simulated A/B board of tests/support_update.py,
the engine in-process so a test can act at a phase's start)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from support_swu import build_swu
from support_update import MACHINE, Lab, load_state, rootfs_image, save_state

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
