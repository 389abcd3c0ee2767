"""Routed fabric: networkd files from the description, and the bridge check behind
`alma lint`, the image class and `alma-fabric check`."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import pytest
from almaboard import netcheck
from almaboard.errors import ConfigError
from almaguard.fabric import load, parse
from support_guard import ALMA_FABRIC, GUARD_DIR, REPO

from alma.lint.fabric import check_layer

RING = GUARD_DIR / "conf" / "fabric.toml"


def ini(text: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(text)
    return cp


def test_shipped_ring_generates_routed_point_to_point_links() -> None:
    fab = load(RING)
    assert fab.nodes == ["alma-orin-1", "alma-orin-2", "alma-orin-3"]
    files = fab.networkd_files("alma-orin-1")
    assert sorted(files) == ["10-alma-fabric-eth1.network", "10-alma-fabric-eth2.network"]
    eth1 = ini(files["10-alma-fabric-eth1.network"])
    assert eth1["Match"]["Name"] == "eth1"
    assert eth1["Network"]["Address"] == "10.77.0.0/31"
    assert eth1["Network"]["IPForward"] == "yes"
    assert eth1["Link"]["MTUBytes"] == "9000"
    assert "Bridge" not in eth1["Network"]
    # orin-1 reaches the orin-2<->orin-3 cable through its first hop on eth1 (orin-2, 10.77.0.1)
    assert eth1["Route"]["Destination"] == "10.77.0.2/31" and eth1["Route"]["Gateway"] == "10.77.0.1"
    eth2 = ini(files["10-alma-fabric-eth2.network"])
    assert eth2["Network"]["Address"] == "10.77.0.5/31"  # the b end of 10.77.0.4/31
    # the peers agree on the subnet and take the other address
    peer = ini(fab.networkd_files("alma-orin-2")["10-alma-fabric-eth1.network"])
    assert peer["Network"]["Address"] == "10.77.0.1/31"


def test_generated_files_pass_the_bridge_check(tmp_path: Path) -> None:
    fab = load(RING)
    out = tmp_path / "etc/systemd/network"
    out.mkdir(parents=True)
    for node in fab.nodes:
        for name, text in fab.networkd_files(node).items():
            (out / f"{node}-{name}").write_text(text)
    assert netcheck.scan_rootfs(tmp_path, fab.ports()) == []


def test_slash_30_uses_the_two_host_addresses() -> None:
    fab = parse({"link": [{"a": "x:e0", "b": "y:e0", "subnet": "10.0.0.4/30"}]})
    assert fab.links[0].addresses() == ("10.0.0.5/30", "10.0.0.6/30")


LINK2 = """[[link]]
a = "n1:eth1"
b = "n2:eth1"
subnet = "10.0.0.0/31"

[[link]]
a = "n2:eth2"
b = "n3:eth1"
"""


@pytest.mark.parametrize(
    ("links", "needle"),
    [
        ([{"a": "n1-eth1", "b": "n2:eth1", "subnet": "10.0.0.0/31"}], "is not 'node:port'"),
        ([{"a": "n1:eth1", "b": "n1:eth2", "subnet": "10.0.0.0/31"}], "both ends are on node n1"),
        ([{"a": "n1:eth1", "b": "n2:eth1", "subnet": "10.0.0.0/24"}], "wider than a point-to-point link"),
        ([{"a": "n1:eth1", "b": "n2:eth1", "subnet": "10.0.0.1/31"}], "subnet:"),
        (
            [
                {"a": "n1:eth1", "b": "n2:eth1", "subnet": "10.0.0.0/31"},
                {"a": "n1:eth1", "b": "n3:eth1", "subnet": "10.0.0.2/31"},
            ],
            "n1:eth1 is already used by link 1",
        ),
        (
            [
                {"a": "n1:eth1", "b": "n2:eth1", "subnet": "10.0.0.0/30"},
                {"a": "n1:eth2", "b": "n3:eth1", "subnet": "10.0.0.2/31"},
            ],
            "overlaps",
        ),
    ],
)
def test_bad_fabric_descriptions_are_refused(links: list[dict[str, str]], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse({"link": links})
    assert needle in err.value.message


def _rootfs_with_bridge(root: Path) -> None:
    (root / "etc/alma").mkdir(parents=True)
    (root / "etc/alma/fabric.toml").write_text(RING.read_text())
    nd = root / "etc/systemd/network"
    nd.mkdir(parents=True)
    (nd / "br0.netdev").write_text("[NetDev]\nName=br0\nKind=bridge\n")
    (nd / "20-fabric.network").write_text("[Match]\nName=eth1 eth2\n\n[Network]\nBridge=br0\n")
    # a bridge over a non-fabric port (a VM tap) is allowed
    (nd / "30-tap.network").write_text("[Match]\nName=tap0\n\n[Network]\nBridge=br0\n")


def test_networkd_bridge_over_a_fabric_port_is_found(tmp_path: Path) -> None:
    _rootfs_with_bridge(tmp_path)
    hits = netcheck.scan_rootfs(tmp_path)
    assert [(h.path.name, h.line) for h in hits] == [("20-fabric.network", 5)]
    assert "fabric port eth1, eth2 to a bridge br0 (Kind=bridge in br0.netdev)" in hits[0].message


def test_bridge_set_in_a_dropin_and_globbed_match_are_found(tmp_path: Path) -> None:
    nd = tmp_path / "usr/lib/systemd/network"
    (nd / "50-all.network.d").mkdir(parents=True)
    (nd / "50-all.network").write_text("[Match]\nName=eth*\n")
    (nd / "50-all.network.d" / "bridge.conf").write_text("[Network]\nBridge=br9\n")
    hits = netcheck.scan_rootfs(tmp_path, ["eth1"])
    assert len(hits) == 1 and "eth*" in hits[0].message


def test_networkmanager_bridge_slave_and_ifupdown_are_found(tmp_path: Path) -> None:
    nm = tmp_path / "etc/NetworkManager/system-connections"
    nm.mkdir(parents=True)
    (nm / "bridge-slave-eth2.nmconnection").write_text(
        "[connection]\nid=bridge-slave-eth2\ntype=ethernet\ninterface-name=eth2\nmaster=br0\nslave-type=bridge\n"
    )
    (nm / "port-eth1.nmconnection").write_text(
        "[connection]\nid=p\ntype=ethernet\ninterface-name=eth1\ncontroller=br0\nport-type=bridge\n"
    )
    (nm / "uplink.nmconnection").write_text("[connection]\nid=u\ntype=ethernet\ninterface-name=eth0\n")
    (tmp_path / "etc/network").mkdir(parents=True)
    (tmp_path / "etc/network/interfaces").write_text("auto br0\niface br0 inet dhcp\n    bridge_ports eth1 eth0\n")
    hits = netcheck.scan_rootfs(tmp_path, ["eth1", "eth2"])
    found = sorted((h.path.name, h.line) for h in hits)
    assert found == [("bridge-slave-eth2.nmconnection", 6), ("interfaces", 3), ("port-eth1.nmconnection", 6)]


def test_no_fabric_ports_known_means_nothing_to_flag(tmp_path: Path) -> None:
    nd = tmp_path / "etc/systemd/network"
    nd.mkdir(parents=True)
    (nd / "x.network").write_text("[Match]\nName=eth1\n[Network]\nBridge=br0\n")
    assert netcheck.scan_rootfs(tmp_path) == []
    assert len(netcheck.scan_rootfs(tmp_path, ["eth*"])) == 1


def test_alma_lint_check_layer_finds_a_bridge_in_a_layer(tmp_path: Path) -> None:
    layer = tmp_path / "meta-x"
    files = layer / "recipes-core/net-bridge/files"
    files.mkdir(parents=True)
    (layer / "conf").mkdir()
    (layer / "conf/layer.conf").write_text('ALMA_FABRIC_PORTS ?= "enP5p1s0"\n')
    (files / "10-br.netdev").write_text("[NetDev]\nName=br-lab\nKind=bridge\n")
    (files / "11-fabric.network").write_text("[Match]\nName=enP5p1s0\n\n[Network]\nBridge=br-lab\n")
    findings = check_layer(layer)
    assert len(findings) == 1
    f = findings[0]
    assert (f.path.name, f.line, f.check) == ("11-fabric.network", 5, "fabric")
    assert "enP5p1s0" in f.message
    # ports from the shipped fabric description count too
    (files / "12-eth1.network").write_text("[Match]\nName=eth1\n[Network]\nBridge=br-lab\n")
    assert len(check_layer(layer)) == 2


def test_the_real_layer_bridges_no_fabric_port() -> None:
    assert check_layer(REPO / "layers" / "meta-alma") == []


def test_alma_fabric_cli_generate_and_check(tmp_path: Path) -> None:
    root = tmp_path / "board"
    (root / "etc/alma").mkdir(parents=True)
    (root / "etc/alma/fabric.toml").write_text(RING.read_text())
    (root / "etc/hostname").write_text("alma-orin-3\n")
    out = root / "run/systemd/network"
    out.mkdir(parents=True)
    (out / "10-alma-fabric-eth9.network").write_text("stale\n")  # a link since removed
    (out / "99-other.network").write_text("[Match]\nName=usb0\n")  # not ours: kept
    r = subprocess.run(
        [sys.executable, str(ALMA_FABRIC), "--root", str(root), "generate"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "10-alma-fabric-eth1.network",
        "10-alma-fabric-eth2.network",
        "99-other.network",
    ]
    r = subprocess.run([sys.executable, str(ALMA_FABRIC), "--root", str(root), "check"], capture_output=True, text=True)
    assert r.returncode == 0 and "no fabric port is bridged" in r.stdout
    (out / "20-br.network").write_text("[Match]\nName=eth2\n[Network]\nBridge=br0\n")
    r = subprocess.run([sys.executable, str(ALMA_FABRIC), "--root", str(root), "check"], capture_output=True, text=True)
    assert r.returncode == 1 and "20-br.network:4:" in r.stdout


def test_alma_fabric_bad_description_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "fabric.toml"
    bad.write_text('[[link]]\na = "x:e0"\nb = "y:e0"\nsubnet = "10.0.0.0/16"\n')
    r = subprocess.run(
        [sys.executable, str(ALMA_FABRIC), "--config", str(bad), "generate", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "try:" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


# Accepted or a traceback before the typed reader: a float, huge or negative mtu/speed went into
# the networkd files; an unknown key in a link (a typo of "speed") was silently ignored.
@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ("[fabric]\nmtu = 9000.5\n", 2, "fabric.mtu"),
        (LINK2 + "speed = -1\n", 9, "link.2.speed"),
        (LINK2 + "sped = 1000\n", 9, "unknown key(s) in [link.2]: sped"),
        (LINK2 + "mtu = nan\n", 9, "link.2.mtu"),
    ],
)
def test_bad_values_are_refused_at_their_line(tmp_path: Path, text: str, line: int, key: str) -> None:
    conf = tmp_path / "fabric.toml"
    conf.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(conf)
    assert err.value.message.startswith(f"{conf}:{line}: {key}")
