"""`alma update`'s ssh connections: one per board boot within a run, none left after it
(real sshd per simulated board, docs/ota.md "Per board")."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from support_update import Lab, alma, make_swu


@pytest.mark.slow
def test_a_run_shares_one_ssh_connection_per_board_boot_and_leaves_none_open(
    tmp_path: Path, signer: tuple[bytes, bytes], lab_factory: Callable[..., Lab], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet that keeps no connections (no control_persist): the run's calls to a board still
    ride one connection per boot (the board sees one client port), and none outlives the run."""
    lab = lab_factory(["s1"])
    text = lab.fleet.read_text()
    lab.fleet.write_text(re.sub(r"control_persist = \d+\ncontrol_dir = \"[^\"]*\"\n", "", text))
    swu = make_swu(tmp_path, signer)
    seen = tmp_path / "connections"
    # every agent call notes the connection it came in on (client address and port)
    agent = f'echo "$SSH_CONNECTION" >> {seen}; alma-ota'
    run_tmp = Path(tempfile.mkdtemp(prefix="j"))  # short: a control socket path must fit sun_path
    monkeypatch.setenv("TMPDIR", str(run_tmp))  # where the run makes its control directory
    try:
        # the default boot and health windows: a healthy board ends them as soon as it answers,
        # a short one would fail this run on a loaded host
        r = alma(tmp_path, "update", str(swu), "--fleet", str(lab.fleet), "--json", "--agent", agent,
                 "--poll", "0.1")  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        assert [b["result"] for b in json.loads(r.stdout)["boards"]] == ["COMMITTED"]
        calls = [ln.split() for ln in seen.read_text().splitlines() if ln.strip()]
        assert len(calls) >= 6  # status, begin, receive, install, status, reboot, status..., commit
        ports = {c[1] for c in calls}
        # one connection before the reboot, one after (a poll racing the boot may add one)
        assert len(ports) <= 3, calls
        assert list(run_tmp.iterdir()) == []  # the run's control directory is gone
        masters = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert str(run_tmp) not in masters
    finally:
        shutil.rmtree(run_tmp, ignore_errors=True)
