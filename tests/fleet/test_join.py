"""`alma fleet add`, the [[node]] entry of a flashed board and pinned host keys (issue 14)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import require_tool, run_cli
from support_build import ADMIN_FPR, ADMIN_PUB

from alma.errors import UserError
from alma.fleet import join
from alma.fleet.inventory import SshConfig, load_fleet, parse_fleet
from alma.fleet.ssh import ssh_argv

FP = ADMIN_FPR  # any valid SHA256 fingerprint shape


@pytest.fixture
def alma(capsys):  # type: ignore[no-untyped-def]
    return lambda *a: run_cli(capsys, *a)


def test_fleet_add_creates_the_file_and_validates_like_the_loader(tmp_path, alma):
    f = tmp_path / "fleet.toml"
    code, out, err = alma("fleet", "add", "edge-01", "--ssh", "alma@192.0.2.7", "--alias", "Edge A",
                          "--host-key", FP, "--fleet", str(f))  # fmt: skip
    assert code == 0, err
    fl = load_fleet(f)
    [n] = fl.nodes
    assert (n.name, n.ssh, n.role, n.alias, n.host_key) == ("edge-01", "alma@192.0.2.7", "board", "Edge A", FP)
    assert 'host_key = "' + FP + '"' in out and f"added edge-01 to {f}" in err
    code, _, err = alma("fleet", "add", "edge-02", "--ssh", "alma@192.0.2.8", "--role", "cluster", "--fleet", str(f))
    assert code == 0 and [n.name for n in load_fleet(f).nodes] == ["edge-01", "edge-02"]


def test_fleet_add_keeps_existing_settings(tmp_path, alma):
    f = tmp_path / "fleet.toml"
    f.write_text("[ssh]\nconnect_timeout = 9\n[health]\ntimeout = 7\n")  # a fleet with no node yet
    assert alma("fleet", "add", "edge-01", "--ssh", "192.0.2.7", "--fleet", str(f))[0] == 0
    fl = load_fleet(f)
    assert fl.ssh.connect_timeout == 9 and fl.timeout == 7.0 and fl.nodes[0].host_key is None


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (("../x", "--ssh", "h"), "not a host name"),
        (("edge\nx", "--ssh", "h"), "not a host name"),
        (("edge-01", "--ssh", "-oProxyCommand=x"), "not an ssh destination"),
        (("edge-01", "--ssh", 'h"\n[[node]]'), "not an ssh destination"),
        (("edge-01", "--ssh", "h\n"), "not an ssh destination"),
        (("edge-01\n", "--ssh", "h"), "not a host name"),
        (("edge-01", "--ssh", "h", "--role", "king"), "must be one of"),
        (("edge-01", "--ssh", "h", "--alias", 'a"b'), "--alias"),
        (("edge-01", "--ssh", "h", "--host-key", "SHA256:short"), "43 base64 characters"),
        (("edge-01", "--ssh", "h", "--host-key", "ssh-ed25519 AAAA"), "truncated or corrupt"),
    ],
)
def test_fleet_add_refuses_bad_input_and_writes_nothing(tmp_path, alma, args, why):
    f = tmp_path / "fleet.toml"
    code, _, err = alma("fleet", "add", *args, "--fleet", str(f))
    assert code == 2 and why in err, err
    assert not f.exists()


def test_fleet_add_refuses_a_duplicate_and_a_broken_file(tmp_path, alma):
    f = tmp_path / "fleet.toml"
    f.write_text('[[node]]\nname = "edge-01"\nssh = "h"\nrole = "board"\n')
    before = f.read_text()
    code, _, err = alma("fleet", "add", "edge-01", "--ssh", "h2", "--fleet", str(f))
    assert code == 2 and "already in the fleet" in err and f.read_text() == before
    f.write_text("[[node]\n")
    code, _, err = alma("fleet", "add", "edge-02", "--ssh", "h2", "--fleet", str(f))
    assert code == 2 and "invalid TOML" in err and f.read_text() == "[[node]\n"


def test_loader_validates_host_key(tmp_path):
    base = '[[node]]\nname = "n"\nssh = "h"\nrole = "board"\n'
    assert parse_fleet(base + f'host_key = "{ADMIN_PUB}"\n', tmp_path / "f").nodes[0].host_key == " ".join(
        ADMIN_PUB.split()[:2]
    )
    from alma.errors import ConfigError

    with pytest.raises(ConfigError, match=r":5: node 'n': host_key: unsupported key type"):
        parse_fleet(base + 'host_key = "ssh-dss AAAA"\n', tmp_path / "f")


def _rec(**boot: object) -> SimpleNamespace:
    b = SimpleNamespace(seen=True, board=boot.get("board"))
    return SimpleNamespace(result="SUCCESS", booted=boot.get("booted", True), boot=b, identity=boot.get("identity"),
                           board={"usb_instance": "1-3"})  # fmt: skip


def test_entry_from_a_booted_board():
    line = {"name": "edge-01", "addresses": ["192.0.2.7", "fd00::7"], "hostkey": FP}
    entry, _ = join.entry_from_record(_rec(board=line, identity={"hostname": "edge-01"}))
    assert entry == join.NodeEntry("edge-01", "alma@192.0.2.7", "board", FP)
    # the board did not take its name (hook refused): not joined, with the reason
    entry, why = join.entry_from_record(_rec(board={**line, "name": "jetson"}, identity={"hostname": "edge-01"}))
    assert entry is None and "did not apply" in why
    entry, why = join.entry_from_record(_rec(board={**line, "addresses": []}))
    assert entry is None and "no address" in why
    entry, why = join.entry_from_record(_rec(board=None))
    assert entry is None and "no 'alma-board:' line" in why
    entry, why = join.entry_from_record(_rec(booted=False))
    assert entry is None and "not seen booting" in why


def test_pinned_options_come_first_and_are_strict(tmp_path):
    node = parse_fleet(f'[[node]]\nname = "n"\nssh = "h"\nrole = "board"\nhost_key = "{ADMIN_PUB}"\n', tmp_path / "f")
    cfg = SshConfig(strict_host_key_checking="no", known_hosts=tmp_path / "user_known", control_dir=tmp_path)
    argv = ssh_argv(node.nodes[0], "true", cfg)
    # ssh keeps the FIRST value of an option: the pin must precede the fleet's weaker policy
    assert argv.index("StrictHostKeyChecking=yes") < argv.index("StrictHostKeyChecking=no")
    known = tmp_path / "pinned" / "n.known_hosts"
    assert argv.index(f"UserKnownHostsFile={known}") < argv.index(f"UserKnownHostsFile={tmp_path / 'user_known'}")
    assert "HostKeyAlias=n" in argv and known.read_text() == "n " + " ".join(ADMIN_PUB.split()[:2]) + "\n"
    assert oct(known.stat().st_mode & 0o777) == "0o600"


def test_fingerprint_pin_keeps_only_a_scanned_key_with_that_fingerprint(tmp_path):
    require_tool("ssh-keygen")
    k = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(k)], check=True)
    pub = " ".join(Path(f"{k}.pub").read_text().split()[:2])
    fp = subprocess.run(["ssh-keygen", "-lf", f"{k}.pub"], capture_output=True, text=True).stdout.split()[1]
    node = parse_fleet(f'[[node]]\nname = "n"\nssh = "h"\nrole = "board"\nhost_key = "{fp}"\n', tmp_path / "f").nodes[0]
    cfg = SshConfig(control_dir=tmp_path)
    scans: list[str] = []

    def scan(n, c):  # type: ignore[no-untyped-def]
        scans.append(n.name)
        return [" ".join(ADMIN_PUB.split()[:2]), pub]  # a decoy first

    path = join.pinned_known_hosts(node, cfg, scan=scan)
    assert path.read_text() == f"n {pub}\n"
    join.pinned_known_hosts(node, cfg, scan=scan)
    assert scans == ["n"]  # resolved once, then reused while the fingerprint matches
    path.unlink()
    assert join.pinned_known_hosts(node, cfg, scan=lambda n, c: [" ".join(ADMIN_PUB.split()[:2])]).read_text() == ""


def test_add_to_fleet_never_writes_what_the_loader_refuses(tmp_path):
    f = tmp_path / "fleet.toml"
    f.write_text('[[node]]\nname = "a"\nssh = "h"\nrole = "board"\nbogus = 1\n')
    with pytest.raises(UserError):
        join.add_to_fleet(f, join.make_entry("edge-01", "h"))
    assert "edge-01" not in f.read_text()


def test_unwritable_places_fail_closed(tmp_path, monkeypatch):
    def boom(*a, **k):  # type: ignore[no-untyped-def]
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(join, "write_atomic", boom)
    with pytest.raises(UserError, match="cannot write fleet file .*: Read-only file system"):
        join.add_to_fleet(tmp_path / "fleet.toml", join.make_entry("edge-01", "h"))
    assert not (tmp_path / "fleet.toml").exists()
    node = parse_fleet(f'[[node]]\nname = "n"\nssh = "h"\nrole = "board"\nhost_key = "{ADMIN_PUB}"\n', tmp_path / "f")
    argv = ssh_argv(node.nodes[0], "true", SshConfig(control_dir=tmp_path))
    assert argv.index("UserKnownHostsFile=/dev/null") < argv.index("BatchMode=yes")
