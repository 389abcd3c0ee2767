"""`alma fleet add`, the [[node]] entry of a flashed board and pinned host keys."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest
from support import require_tool, run_cli
from support_build import ADMIN_FPR, ADMIN_PUB

from alma.errors import ConfigError, UserError
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
    deep = "x = " + "{a = " * 2000 + "1" + "}" * 2000 + "\n"  # tomllib's recursion: was exit 70
    f.write_text(deep)
    code, _, err = alma("fleet", "add", "edge-02", "--ssh", "h2", "--fleet", str(f))
    assert code == 2 and "invalid TOML: nested too deeply" in err and f.read_text() == deep


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
    assert argv.index("UserKnownHostsFile=/dev/null") < argv.index(f'UserKnownHostsFile="{tmp_path / "user_known"}"')
    hook = next(a for a in argv if a.startswith("KnownHostsCommand="))
    assert ADMIN_FPR in hook and hook.endswith(" %H %t %K") and "HostKeyAlias=n" in argv
    assert not list(tmp_path.rglob("*.known_hosts"))  # no pin state on disk to plant or share


def test_the_pin_hook_vouches_only_for_the_pinned_fingerprint(capsys):
    from alma.fleet import pinhook

    blob = ADMIN_PUB.split()[1]
    assert pinhook.main([ADMIN_FPR, "edge-01", "ssh-ed25519", "NONE"]) == 0
    assert capsys.readouterr().out == ""  # ssh only choosing algorithms
    assert pinhook.main([ADMIN_FPR, "edge-01", "ssh-ed25519", blob]) == 0
    assert capsys.readouterr().out == f"edge-01 ssh-ed25519 {blob}\n"
    other = "SHA256:" + "A" * 43
    assert pinhook.main([other, "edge-01", "ssh-ed25519", blob]) == 0
    out = capsys.readouterr()
    assert out.out == "" and f"pinned {other}, the host offered ssh-ed25519 {ADMIN_FPR}" in out.err


@pytest.mark.parametrize("path", ["/tmp/a b/k", '/tmp/q"uote', "/tmp/back\\slash", "/tmp/pct%d", "/tmp/tab\tx"])
def test_paths_are_quoted_the_way_ssh_splits_them(path, tmp_path):
    """OpenSSH splits UserKnownHostsFile on whitespace; a control dir with a space
    made it read a second, planted file. Checked against ssh's own parser (ssh -G)."""
    require_tool("ssh")
    if "\t" in path:
        with pytest.raises(ConfigError, match="control characters"):
            join.ssh_quote(path, "p")
        return
    opt = f"UserKnownHostsFile={join.ssh_quote(path, 'p')}"
    r = subprocess.run(["ssh", "-F", "/dev/null", "-G", "-o", opt, "h"], capture_output=True, text=True, check=True)
    [line] = [ln for ln in r.stdout.splitlines() if ln.startswith("userknownhostsfile ")]
    assert line == f"userknownhostsfile {path}"


def test_concurrent_adds_all_land(tmp_path):
    """10 parallel adds all exited 0 "added"; 6-8 survived."""
    import sys

    f = tmp_path / "fleet.toml"
    f.write_text('[health]\ntimeout = 20\n')
    procs = [subprocess.Popen([sys.executable, "-m", "alma", "fleet", "add", f"edge-{i:02d}", "--ssh", f"h{i}",
                               "--fleet", str(f)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for i in range(10)]  # fmt: skip
    assert [p.wait(timeout=120) for p in procs] == [0] * 10
    assert sorted(n.name for n in load_fleet(f).nodes) == [f"edge-{i:02d}" for i in range(10)]


def test_a_symlinked_fleet_file_stays_a_symlink(tmp_path):
    """The symlink was replaced by a regular file (the real one left stale)."""
    real = tmp_path / "repo" / "fleet.toml"
    real.parent.mkdir()
    real.write_text('[[node]]\nname = "a"\nssh = "h"\nrole = "board"\n')
    link = tmp_path / "fleet.toml"
    link.symlink_to(real)
    join.add_to_fleet(link, join.make_entry("edge-01", "h2"))
    assert link.is_symlink() and "edge-01" in real.read_text()


def test_names_are_unique_ignoring_case(tmp_path):
    f = tmp_path / "fleet.toml"
    join.add_to_fleet(f, join.make_entry("edge-01", "h"))
    with pytest.raises(UserError, match="already in the fleet .*case-insensitively"):
        join.add_to_fleet(f, join.make_entry("EDGE-01", "h2"))
    with pytest.raises(ConfigError, match="duplicate node name 'EDGE-01'"):
        parse_fleet(f.read_text() + '[[node]]\nname = "EDGE-01"\nrole = "board"\n', f)


def test_a_scope_id_address_never_stops_the_other_boards(tmp_path):
    """A console address fe80::1%eth0 made make_entry raise out of after_flash."""
    boot = SimpleNamespace(board={"name": "edge-01", "addresses": ["fe80::1%eth0"], "hostkey": FP})
    good = SimpleNamespace(board={"name": "edge-02", "addresses": ["192.0.2.8"], "hostkey": FP})

    def rec(b):  # type: ignore[no-untyped-def]
        return SimpleNamespace(result="SUCCESS", booted=True, boot=b, identity=None, board={"usb_instance": "1-3"})

    f = tmp_path / "fleet.toml"
    out = join.after_flash([rec(boot), rec(good)], f)
    assert out[0]["entry"] is None and "no usable address" in out[0]["reason"]
    assert out[1]["entry"]["name"] == "edge-02" and [n.name for n in load_fleet(f).nodes] == ["edge-02"]


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
