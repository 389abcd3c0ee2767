"""Run under umockdev-run: AlmaFlashDriver on a local AlmaRecoveryBoard (no exporter), two bundles.

    umockdev-run --device BOARD -- python local_flash.py GOOD_BUNDLE FAILING_BUNDLE

Prints one JSON object: the first record, and the FlashFailed message/record of the second."""

from __future__ import annotations

import json
import sys

from labgrid import Target

from alma.labgrid import AlmaFlashDriver, AlmaRecoveryBoard, FlashFailed


def main() -> int:
    good, bad = sys.argv[1:3]
    t = Target("bench")
    board = AlmaRecoveryBoard(t, name=None, usb_path="1-3")
    drv = AlmaFlashDriver(t, name=None)
    t.activate(drv)
    out: dict[str, object] = {"avail": board.avail, "module": board.board.module if board.board else None}
    out["good"] = drv.flash(good).to_dict()
    try:
        drv.flash(bad)
        out["bad"] = "no error"
    except FlashFailed as exc:
        out["bad"] = {"message": exc.message, "hint": exc.hint, "record": exc.record.to_dict() if exc.record else None}
    t.cleanup()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
