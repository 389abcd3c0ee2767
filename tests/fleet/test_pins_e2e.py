"""Pins that hold, against a REAL sshd: the host key is checked by ssh itself,
through whatever path reaches the node, and no file on disk can widen what is trusted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO
from support_fleet import Sshd

pytestmark = pytest.mark.slow
ALMA = [sys.executable, "-m", "alma"]
# A stdio <-> TCP relay: what `ProxyCommand` / a bastion's `ssh -W` is to ssh.
PROXY = """
import socket, sys, threading
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
def up():
    while True:
        b = sys.stdin.buffer.read1(65536)
        if not b:
            s.shutdown(socket.SHUT_WR)
            return
        s.sendall(b)
threading.Thread(target=up, daemon=True).start()
while True:
    b = s.recv(65536)
    if not b:
        break
    sys.stdout.buffer.write(b)
    sys.stdout.buffer.flush()
"""


def fingerprint(pub: Path) -> str:
    return subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout.split()[1]


def other_key(tmp: Path) -> Path:
    k = tmp / "other_host_key"
    if not k.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(k)], check=True)
    return Path(f"{k}.pub")


def client_config(sshd: Sshd, tmp: Path) -> Path:
    """The lab's ssh config WITHOUT any known_hosts: only the pin can vouch for the node."""
    proxy = tmp / "proxy.py"
    proxy.write_text(PROXY)
    cfg = tmp / "ssh_config"
    cfg.write_text(
        f"Host direct\n    HostName 127.0.0.1\n    Port {sshd.port}\n"
        # only reachable through the proxy: ssh-keyscan (which ignores ProxyCommand) cannot resolve it
        f"Host behind-bastion\n    HostName edge.bastion-only.invalid\n"
        f'    ProxyCommand {sys.executable} {proxy} {sshd.port}\n'
        f"Host *\n    IdentityFile {sshd.dir / 'id_ed25519'}\n    IdentitiesOnly yes\n"
    )
    return cfg


def health(fleet: Path, env: dict[str, str] | None = None) -> tuple[int, dict[str, dict[str, str]]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ALMA_")}
    r = subprocess.run([*ALMA, "fleet", "health", "--fleet", str(fleet), "--json", "--no-save"], capture_output=True,
                       text=True, timeout=120, env={**base, **(env or {})}, cwd=REPO)  # fmt: skip
    assert r.stdout, r.stderr
    return r.returncode, {n["name"]: n for n in json.loads(r.stdout)["nodes"]}


def fleet_file(path: Path, cfg: Path, nodes: list[tuple[str, str, str]], ssh_extra: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / "ok.py").write_text(OK_REPORT)
    body = f'[ssh]\nconfig = "{cfg}"\nconnect_timeout = 15\n{ssh_extra}[health]\ntimeout = 30\n'
    body += f'command = "python3 {path.parent / "ok.py"}"\n'
    for name, dest, key in nodes:
        body += f'[[node]]\nname = "{name}"\nssh = "{dest}"\nrole = "board"\nhost_key = "{key}"\n'

    path.write_text(body)
    return path


OK_REPORT = """
import json, time
print(json.dumps({"schema": "alma.health/1", "status": "OK", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "checks": [{"name": "disk", "status": "OK", "summary": "ok"}]}))
"""


def test_a_planted_known_hosts_beside_a_spaced_control_dir_cannot_vouch(sshd: Sshd, tmp_path: Path) -> None:
    """The node is pinned to key 1 and answers with key 2. Before: ssh split the pin path
    "<dir>/ctl dir/pinned/edge-01.known_hosts" at the space and also read "<dir>/ctl", where
    an attacker had planted key 2: UNKNOWN became OK. Now: UNKNOWN, expected vs seen key."""
    cfg = client_config(sshd, tmp_path)
    seen = fingerprint(sshd.dir / "host_ed25519.pub")
    pinned = fingerprint(other_key(tmp_path))
    key2 = (sshd.dir / "host_ed25519.pub").read_text().split()
    (tmp_path / "ctl").write_text(f"edge-01 {key2[0]} {key2[1]}\n* {key2[0]} {key2[1]}\n")  # the plant
    f = fleet_file(tmp_path / "fleet.toml", cfg, [("edge-01", "direct", pinned)],
                   ssh_extra=f'control_dir = "{tmp_path / "ctl dir"}"\n')  # fmt: skip
    code, nodes = health(f)
    assert code == 3 and nodes["edge-01"]["status"] == "UNKNOWN", nodes
    summary = nodes["edge-01"]["summary"]
    assert "Host key verification failed" in summary
    assert f"pinned {pinned}, the host offered ssh-ed25519 {seen}" in summary


def test_a_correct_pin_holds_with_a_space_in_home(sshd: Sshd, tmp_path: Path) -> None:
    """Before: with HOME containing a space, correctly pinned nodes always failed."""
    home = tmp_path / "home with space"
    home.mkdir()
    cfg = client_config(sshd, tmp_path)
    f = fleet_file(tmp_path / "fleet.toml", cfg, [("edge-01", "direct", fingerprint(sshd.dir / "host_ed25519.pub"))])
    code, nodes = health(f, {"HOME": str(home), "XDG_CACHE_HOME": "", "XDG_STATE_HOME": ""})
    assert code == 0 and nodes["edge-01"]["status"] == "OK", nodes


def test_pins_hold_through_a_proxycommand_and_ssh_itself_checks_them(sshd: Sshd, tmp_path: Path) -> None:
    """Before: ssh-keyscan went direct (no ProxyCommand), so a pinned node behind a bastion
    never verified, with a message that read like a MITM."""
    cfg = client_config(sshd, tmp_path)
    right = fingerprint(sshd.dir / "host_ed25519.pub")
    wrong = fingerprint(other_key(tmp_path))
    full = " ".join((sshd.dir / "host_ed25519.pub").read_text().split()[:2])
    f = fleet_file(tmp_path / "fleet.toml", cfg, [("edge-01", "behind-bastion", right),
                                                  ("edge-02", "behind-bastion", full),
                                                  ("edge-03", "behind-bastion", wrong)])  # fmt: skip
    code, nodes = health(f)
    assert nodes["edge-01"]["status"] == "OK" and nodes["edge-02"]["status"] == "OK", nodes
    assert nodes["edge-03"]["status"] == "UNKNOWN"
    assert f"pinned {wrong}, the host offered" in nodes["edge-03"]["summary"]
    assert code == 3


def test_two_fleets_with_the_same_node_name_never_share_a_pin(sshd: Sshd, tmp_path: Path) -> None:
    """Before: pins were files keyed by node name only: two fleets with an edge-01 each
    overwrote each other's pin (18 false failures in 112 runs)."""
    cfg = client_config(sshd, tmp_path)
    right = fingerprint(sshd.dir / "host_ed25519.pub")
    wrong = " ".join(other_key(tmp_path).read_text().split()[:2])
    a = fleet_file(tmp_path / "a" / "fleet.toml", cfg, [("edge-01", "direct", right)])
    b = fleet_file(tmp_path / "b" / "fleet.toml", cfg, [("edge-01", "direct", wrong)])
    base = {k: v for k, v in os.environ.items() if not k.startswith("ALMA_")}
    for _ in range(3):
        procs = [subprocess.Popen([*ALMA, "fleet", "health", "--fleet", str(p), "--json", "--no-save"], cwd=REPO,
                                  env=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for p in (a, b)]  # fmt: skip
        outs = [p.communicate(timeout=120)[0] for p in procs]
        assert json.loads(outs[0])["nodes"][0]["status"] == "OK"
        assert json.loads(outs[1])["nodes"][0]["status"] == "UNKNOWN"


def test_a_master_opened_by_another_fleet_does_not_vouch_for_a_pinned_node(sshd: Sshd, tmp_path: Path) -> None:
    """Fleet A reaches the host unpinned (its own known_hosts) and leaves a master open;
    fleet B pins the same destination to another key, with the same control dir. Before:
    the control path was host/port/user only, so B's node rode A's master and showed OK."""
    import shutil
    import tempfile

    cfg = client_config(sshd, tmp_path)
    known = tmp_path / "known_hosts"
    key = (sshd.dir / "host_ed25519.pub").read_text().split()
    known.write_text(f"[127.0.0.1]:{sshd.port} {key[0]} {key[1]}\n")
    cm = Path(tempfile.mkdtemp(prefix="alma-cm-", dir="/tmp"))  # short: a unix socket path has ~100 bytes
    shared = f'control_persist = 60\ncontrol_dir = "{cm}"\n'
    a = fleet_file(tmp_path / "a" / "fleet.toml", cfg, [("edge-01", "direct", "")],
                   ssh_extra=shared + f'known_hosts = "{known}"\n')  # fmt: skip
    a.write_text(a.read_text().replace('host_key = ""\n', ""))
    wrong = fingerprint(other_key(tmp_path))
    b = fleet_file(tmp_path / "b" / "fleet.toml", cfg, [("edge-01", "direct", wrong)], ssh_extra=shared)
    try:
        code_a, nodes_a = health(a)
        assert code_a == 0 and nodes_a["edge-01"]["status"] == "OK", nodes_a
        assert any(cm.iterdir())  # A's master is up
        code_b, nodes_b = health(b)
        assert nodes_b["edge-01"]["status"] == "UNKNOWN", nodes_b
        assert f"pinned {wrong}, the host offered" in nodes_b["edge-01"]["summary"]
    finally:
        for sock in cm.iterdir():
            subprocess.run(["ssh", "-F", str(cfg), "-o", f"ControlPath={sock}", "-O", "exit", "direct"],
                           capture_output=True, timeout=30)  # fmt: skip
        shutil.rmtree(cm, ignore_errors=True)
