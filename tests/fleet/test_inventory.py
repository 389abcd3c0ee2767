"""The fleet file: valid files load, malformed ones fail with file:line and exit 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from alma.cli.main import main
from alma.errors import ConfigError
from alma.fleet.inventory import DEFAULT_HEALTH_COMMAND, load_fleet, parse_fleet

GOOD = """
[ssh]
config = "ssh_config"
strict_host_key_checking = "accept-new"
connect_timeout = 3

[health]
timeout = 7
stale_after = 120
reserve = "2GiB"

[panel]
title = "Lab"
stale_after = 600
[[panel.figure]]
label = "Boards flashed"
value = 0
[[panel.figure]]
label = "Uptime"
value = "99.50"
unit = "%"

[[node]]
name = "orin-01"
ssh = "op@orin-01.lab"
role = "board"
alias = "Edge A"
reserve = "4GiB"
links = [{ iface = "eth1", speed = 10000, peer = "orin-02" }]

[[node]]
name = "cockpit"
role = "desktop"
health_command = "python3 /opt/alma-health --json"
"""


def test_good_file(tmp_path: Path) -> None:
    fl = parse_fleet(GOOD, tmp_path / "fleet.toml")
    a, b = fl.nodes
    assert (a.name, a.ssh, a.role, a.alias, a.reserve_bytes) == (
        "orin-01",
        "op@orin-01.lab",
        "board",
        "Edge A",
        4 << 30,
    )
    assert a.links[0].iface == "eth1" and a.links[0].speed == 10000 and a.links[0].peer == "orin-02"
    assert a.health_command == DEFAULT_HEALTH_COMMAND
    assert (b.ssh, b.reserve_bytes, b.health_command) == ("cockpit", 2 << 30, "python3 /opt/alma-health --json")
    assert fl.ssh.config == tmp_path / "ssh_config"  # relative to the fleet file
    assert fl.ssh.strict_host_key_checking == "accept-new" and fl.ssh.connect_timeout == 3
    assert (fl.timeout, fl.stale_after) == (7.0, 120.0)
    # published exactly as configured: the zero and the trailing zero survive
    assert [(f.label, f.value, f.unit) for f in fl.panel.figures] == [
        ("Boards flashed", "0", ""),
        ("Uptime", "99.50", "%"),
    ]


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ('[[node]]\nname = "a1"\nrole = "board"\nssh = \n', r"fleet\.toml:4: invalid TOML: "),
        # deep enough to exhaust tomllib's recursion: was a RecursionError (exit 70, a crash)
        ("x = " + "[" * 2000 + "]" * 2000 + "\n", r"fleet\.toml: invalid TOML: nested too deeply"),
        ('[[node]]\nname = "a1"\nrole = "toaster"\n', r"fleet\.toml:3: node 'a1': unknown role 'toaster'"),
        (
            '[[node]]\nname = "a1"\nrole = "board"\n\n[[node]]\nname = "a1"\nrole = "cluster"\n',
            r"fleet\.toml:6: duplicate node name 'a1' \(first declared at line 2\)",
        ),
        ('[[node]]\nrole = "board"\n', r"fleet\.toml:1: node #1 has no name"),
        ('[[node]]\nname = "-oProxyCommand=x"\nrole = "board"\n', r"use letters"),
        ('[[node]]\nname = "a1"\nssh = "-oProxyCommand=x"\nrole = "board"\n', r":3: .*may not start with '-'"),
        ('[[node]]\nname = "a1"\nrole = "board"\ncolour = "red"\n', r"unknown key\(s\) colour"),
        ('[[node]]\nname = "a1"\nrole = "board"\nreserve = "lots"\n', r"expected a size"),
        ('[[node]]\nname = "a1"\nrole = "board"\nlinks = [{ speed = 10 }]\n', r"each link needs iface"),
        ("[health]\ntimeout = 5\n", r"no \[\[node\]\] entries"),
        ('[ssh]\nstrict_host_key_checking = "maybe"\n[[node]]\nname="a1"\nrole="board"\n', r"must be one of"),
        ('[nodes]\nx = 1\n[[node]]\nname="a1"\nrole="board"\n', r"unknown section\(s\): nodes"),
        ('[health]\ntimeout = -1\n[[node]]\nname="a1"\nrole="board"\n', r"toml:2: health.timeout: -1 is out of"),
        # accepted before the typed reader: a report that is never stale, an ssh that never gives up
        ('[health]\nstale_after = 1e300\n[[node]]\nname="a1"\nrole="board"\n', r"toml:2: health.stale_after: .* range"),
        ('[ssh]\n\nconnect_timeout = 99999999\n[[node]]\nname="a1"\nrole="board"\n', r"toml:3: ssh.connect_timeout"),
        ('[health]\ntimout = 5\n[[node]]\nname="a1"\nrole="board"\n', r"toml:2: unknown key.* \[health\]: timout"),
        ('[panel]\nstale = 5\n[[node]]\nname="a1"\nrole="board"\n', r"toml:2: unknown key\(s\) in \[panel\]: stale"),
        ('[[node]]\nname = "a1"\nrole = "board"\nlinks = [{ iface = "e", speed = 1e3 }]\n', r"must be an integer"),
        ('[[panel.figure]]\nlabel = "x"\n[[node]]\nname="a1"\nrole="board"\n', r"needs label"),
        ('[health]\nmax_output = "1B"\n[[node]]\nname="a1"\nrole="board"\n', r"max_output must be between"),
        ('[health]\nmax_output = "lots"\n[[node]]\nname="a1"\nrole="board"\n', r"expected a size"),
    ],
)
def test_malformed(tmp_path: Path, text: str, expect: str) -> None:
    with pytest.raises(ConfigError, match=expect):
        parse_fleet(text, tmp_path / "fleet.toml")


@pytest.mark.parametrize(("verb", "code"), [(["fleet", "health"], 3), (["fleet", "inspect", "a1"], 2)])
def test_cli_error_with_line_and_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: list[str], code: int
) -> None:
    """A bad fleet file: `fleet health` (a monitoring plugin) is UNKNOWN 3, the other verbs exit 2."""
    f = tmp_path / "fleet.toml"
    f.write_text('[[node]]\nname = "a1"\nrole = "toaster"\n')
    with pytest.raises(SystemExit) as exc:
        main([*verb, "--fleet", str(f)])
    assert exc.value.code == code
    err = capsys.readouterr().err
    assert f"{f}:3" in err and "unknown role" in err and "try: role must be one of: board, cluster, desktop" in err


def test_missing_file_names_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match=str(tmp_path / "alma" / "fleet.toml")) as exc:
        load_fleet()
    assert exc.value.hint and "--fleet" in exc.value.hint
    monkeypatch.setenv("ALMA_FLEET", str(tmp_path / "x.toml"))
    with pytest.raises(ConfigError, match="x.toml"):
        load_fleet()


def test_the_fleet_file_is_read_like_every_config_file(tmp_path: Path) -> None:
    """Capped before it is read (a huge file costs nothing), a bad byte named by its line."""
    f = tmp_path / "fleet.toml"
    with open(f, "wb") as fh:
        fh.write(b'[[node]]\nname = "a1"\nrole = "board"\n')
        fh.truncate(5 << 20)  # 5 MiB: over the 4 MiB of any config file
    with pytest.raises(ConfigError, match="over the 4 MiB"):
        load_fleet(f)
    f.write_bytes(b'[[node]]\nname = "caf\xe9"\nrole = "board"\n')
    with pytest.raises(ConfigError, match=re.escape(f"{f}:2: fleet file is not UTF-8 text (byte 0xe9")):
        load_fleet(f)


def test_output_cap_default_and_setting(tmp_path: Path) -> None:
    base = '[[node]]\nname="a1"\nrole="board"\n'
    assert parse_fleet(base, tmp_path / "f.toml").max_output == 1 << 20
    assert parse_fleet('[health]\nmax_output = "64KiB"\n' + base, tmp_path / "f.toml").max_output == 65536


def test_an_alias_names_one_node_only(tmp_path: Path) -> None:
    """Two nodes under one alias would be one series in /metrics (Prometheus keeps either)."""
    text = ('[[node]]\nname = "a1"\nrole = "board"\nalias = "Edge A"\n'
            '[[node]]\nname = "a2"\nrole = "board"\nalias = "edge  a"\n')  # fmt: skip
    with pytest.raises(ConfigError, match=r"fleet.toml:8: node 'a2': alias 'edge  a' is already used at line 4"):
        parse_fleet(text, tmp_path / "fleet.toml")


def test_a_missing_role_says_it_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"fleet.toml:1: node 'a1' has no role"):
        parse_fleet('[[node]]\nname = "a1"\n', tmp_path / "fleet.toml")
