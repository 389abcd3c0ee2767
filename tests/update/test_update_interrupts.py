"""Ctrl-C at EVERY phase of `alma update`, then the same command again: real sshd, real
SWUpdate, the simulated A/B board (tests/support_update.py).

Ctrl-C in `alma update` resets the run's one shared cancel deadline (engine.run_update); here
the test resets it the moment a phase starts (its record already written), which is where a
SIGINT lands at the worst time: the phase's ssh call about to run or in flight. The invariants:
the interrupted run commits nothing and records INTERRUPTED at that phase; the resumed run
finishes the board where the uninterrupted one would have (committed, or rolled back for a
board that fails health), with the board's lock released.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from support_swu import build_swu
from support_update import MACHINE, Lab, load_state, rootfs_image

from alma.errors import Interrupted
from alma.fleet.inventory import load_fleet
from alma.update import engine as E
from alma.update import records as R
from alma.update.swu import read_swu

pytestmark = pytest.mark.slow  # 13 updates + resumes: ~16 min on a loaded 2-core host, ~1 min each

HAPPY = ["check", "lock", "push", "install", "reboot", "wait", "health", "commit"]
# a board failing health on the new slot: health -> rollback -> reboot -> wait -> rollback
SICK = [("health", 1), ("rollback", 1), ("reboot", 2), ("wait", 2), ("rollback", 2)]


def _ctx(lab: Lab, swu: Path, root: Path) -> E.Context:
    info = read_swu(swu)
    opts = E.Options(canary=0, batch=1, boot_timeout=60, health_timeout=10, poll_s=0.1)
    return E.Context(fleet=load_fleet(lab.fleet), swu=swu, info=info, opts=opts, root=root, run=E.run_id(info))


def _interrupt_at(ctx: E.Context, phase: str, nth: int) -> Callable[[str, str], None]:
    seen = {"n": 0}

    def on_event(node: str, what: str) -> None:
        if what == phase:
            seen["n"] += 1
            if seen["n"] == nth:
                ctx.cancel.reset(0, "interrupted")  # what run_update does on KeyboardInterrupt

    return on_event


def _case(
    tmp: Path, signer: tuple[bytes, bytes], lab: Lab, phase: str, nth: int
) -> tuple[R.UpdateRecord, R.UpdateRecord]:
    img = rootfs_image(tmp / "r.ext4", "1.1.0")
    swu = tmp / "u.swu"
    build_swu(swu, machine=MACHINE, version="1.1.0", rootfs=img, cert_pem=signer[0], key_pem=signer[1], root="")
    node = next(iter(lab.boards))
    nodes = [n for n in load_fleet(lab.fleet).nodes if n.name == node]
    ctx = _ctx(lab, swu, tmp / "records")
    ctx.on_event = _interrupt_at(ctx, phase, nth)
    with pytest.raises(Interrupted):
        E.run_update(ctx, nodes)
    first = R.load_existing(tmp / "records", ctx.info.sha256, node)
    assert first is not None
    assert load_state(lab.boards[node].root)["rootfs"]["successful"][1] is False  # nothing committed
    report = E.run_update(_ctx(lab, swu, tmp / "records"), nodes)  # the same command again
    return first, report.records[0]


@pytest.mark.parametrize("phase", HAPPY)
def test_ctrl_c_at_each_phase_then_the_same_command_commits(
    tmp_path: Path, signer: tuple[bytes, bytes], lab_factory: Callable[..., Lab], phase: str
) -> None:
    lab = lab_factory(["i1"])
    first, last = _case(tmp_path, signer, lab, phase, 1)
    assert first.result == R.INTERRUPTED and first.phases[-1].name == phase, first
    assert last.result in R.GOOD, last
    st = load_state(lab.boards["i1"].root)["rootfs"]
    assert st["current"] == 1 and st["successful"][1] is True
    assert 'VERSION_ID="1.1.0"' in (lab.boards["i1"].root / "etc/alma-release").read_text()
    assert not (lab.boards["i1"].root / "data/alma-ota/lock.json").exists()


@pytest.mark.parametrize(("phase", "nth"), SICK)
def test_ctrl_c_at_each_rollback_phase_then_the_same_command_rolls_back(
    tmp_path: Path, signer: tuple[bytes, bytes], lab_factory: Callable[..., Lab], phase: str, nth: int
) -> None:
    lab = lab_factory(["k1"])
    lab.boards["k1"].set(sick=True)
    first, last = _case(tmp_path, signer, lab, phase, nth)
    assert first.result == R.INTERRUPTED and first.phases[-1].name == phase, first
    assert last.result == R.ROLLED_BACK, last
    st = load_state(lab.boards["k1"].root)["rootfs"]
    assert st["current"] == 0 and st["active"] == 0 and st["slots"][1]["status"] == "unbootable"
    assert not (lab.boards["k1"].root / "data/alma-ota/lock.json").exists()
