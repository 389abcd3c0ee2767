"""Parsers against recorded output of the real commands (tests/fleet/recorded/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from alma.fleet import parsers as P

REC = Path(__file__).parent / "recorded"


def rec(name: str) -> str:
    return (REC / name).read_text()


def test_free_debian12_available_is_capacity() -> None:
    m = P.parse_free(rec("free-b_procps-ng-4.0.2_debian12.txt"))
    assert m.total == 25276502016
    assert m.available == 24844812288
    assert (m.swap_total, m.swap_used) == (0, 0)


def test_free_orin_with_swap() -> None:
    m = P.parse_free(rec("free-b_orin-agx-64g_jetpack6.txt"))
    assert m.available == 56175583232
    assert m.swap_total == 32945299456


def test_free_without_available_column_is_refused() -> None:
    # "free" is not capacity: an old procps must be reported, not guessed from.
    with pytest.raises(P.ParseError, match="available"):
        P.parse_free(rec("free-b_procps-3.3.9_no-available.txt"))


@pytest.mark.parametrize("text", ["", "garbage\n", "               total used\nMem: 1 x 3\n"])
def test_free_garbage(text: str) -> None:
    with pytest.raises(P.ParseError):
        P.parse_free(text)


def test_compute_apps_discrete_in_bytes() -> None:
    apps = P.parse_compute_apps(rec("nvidia-smi_compute-apps_discrete.txt"))
    assert [(a.pid, a.name) for a in apps] == [
        (2417, "/usr/lib/xorg/Xorg-compute-probe"),
        (18342, "/home/op/venv/bin/python3"),
        (20111, "ollama_llama_server"),
    ]
    assert apps[1].used_bytes == 10734 * 1024**2


@pytest.mark.parametrize(
    ("name", "raw"),
    [("nvidia-smi_compute-apps_orin.txt", "[N/A]"), ("nvidia-smi_compute-apps_not-supported.txt", "[Not Supported]")],
)
def test_compute_apps_unreported_memory_is_unknown_not_zero(name: str, raw: str) -> None:
    (app,) = P.parse_compute_apps(rec(name))
    assert app.used_bytes is None
    assert app.used_raw == raw


def test_compute_apps_none_and_comma_in_name() -> None:
    assert P.parse_compute_apps(rec("nvidia-smi_compute-apps_none.txt")) == []
    (a,) = P.parse_compute_apps("77, /opt/my, app/run, 12 MiB\n")
    assert (a.pid, a.name, a.used_bytes) == (77, "/opt/my, app/run", 12 * 1024**2)


@pytest.mark.parametrize("bad", ["12, python, lots", "12, python", "12 , x, 3 PiB"])
def test_compute_apps_bad_rows(bad: str) -> None:
    # a row (starts with a pid) that does not parse: the format changed, say so
    with pytest.raises(P.ParseError):
        P.parse_compute_apps(bad)


NOISE = "rm: cannot remove '/root/.pyenv/shims/tmp.ssLLcJW1hv': No such file or directory"


def test_login_shell_noise_is_set_aside_not_parsed() -> None:
    noise: list[str] = []
    procs = P.parse_ps(rec("ps_with_login-shell-noise.txt"), noise)
    assert [p.pid for p in procs] == [1, 2, 1901, 2555]
    assert noise == [NOISE]
    for parse, good in [
        (P.parse_compute_apps, rec("nvidia-smi_compute-apps_orin.txt")),
        (P.parse_ip_brief, rec("ip-br-4_address.txt")),
        (P.parse_rdma_links, rec("rdma_link_show_mlx5.txt")),
        (P.parse_port_attrs, rec("sysfs_ports_grep.txt")),
        (P.parse_swapon, rec("swapon_zram.txt")),
    ]:
        noise = []
        assert parse(NOISE + "\n" + good, noise) == parse(good), parse.__name__
        assert noise == [NOISE], parse.__name__
    noise = []
    assert P.parse_is_active(NOISE + "\nactive\n", 0, noise) == "active" and noise == [NOISE]
    assert P.parse_free(NOISE + "\n" + rec("free-b_procps-ng-4.0.2_debian12.txt")).available == 24844812288


def test_missing_command_detection_bash_and_dash() -> None:
    assert P.missing_command(127, rec("sh_nvidia-smi_not-found.txt")) == "nvidia-smi"
    assert P.missing_command(127, rec("sh_rdma_not-found_dash.txt")) == "rdma"
    assert P.missing_command(1, rec("rdma_no-netlink.txt")) is None


def test_rdma_links() -> None:
    links = P.parse_rdma_links(rec("rdma_link_show_mlx5.txt"))
    assert [(x.link, x.state, x.physical_state, x.netdev) for x in links] == [
        ("mlx5_0/1", "ACTIVE", "LINK_UP", "enp1s0f0np0"),
        ("mlx5_1/1", "DOWN", "DISABLED", "enp1s0f1np1"),
    ]
    assert P.parse_rdma_links("") == []
    with pytest.raises(P.ParseError):
        P.parse_rdma_links("link mlx5_0 state ACTIVE")


def test_ip_brief_rejects_a_changed_row_format() -> None:
    with pytest.raises(P.ParseError):
        P.parse_ip_brief("eth0  UP  fe80::1/64\n")


def test_ip_brief() -> None:
    addrs = P.parse_ip_brief(rec("ip-br-4_address.txt"))
    assert [(a.iface, a.state) for a in addrs] == [("lo", "UNKNOWN"), ("eth0", "UP"), ("enP8p1s0", "UP")]
    assert addrs[2].addresses == ["10.20.0.11/30", "10.20.0.15/30"]


def test_sysfs_ports_with_invalid_argument_lines() -> None:
    ports = P.parse_port_attrs(rec("sysfs_ports_grep.txt"))
    assert (ports["eth0"].carrier, ports["eth0"].speed) == (True, 1000)
    assert (ports["eth1"].carrier, ports["eth1"].speed, ports["eth1"].operstate) == (False, None, "down")
    assert ports["enP8p1s0"].speed == 10000
    assert ports["ifb0"].carrier is None and ports["ifb0"].errors == [
        "carrier: Invalid argument",
        "speed: Invalid argument",
    ]
    noise: list[str] = []
    assert P.parse_port_attrs("something else\n", noise) == {} and noise == ["something else"]


def test_sysfs_ports_grep_s() -> None:
    ports = P.parse_port_attrs(rec("sysfs_ports_grep-s.txt"))
    assert (ports["eth0"].carrier, ports["eth0"].speed) == (True, 1000)
    assert (ports["eth1"].carrier, ports["eth1"].operstate) == (False, "down")
    # a down interface: listed by operstate, carrier unreadable (no line), not missing
    assert ports["ifb0"].carrier is None and ports["ifb0"].operstate == "down"


def test_interleaved_stream_is_why_inspect_uses_grep_s() -> None:
    """The merged-stream corruption recorded with plain `grep -H`: lo's carrier line is
    spliced into an error message and lost; the parser must not invent it."""
    noise: list[str] = []
    ports = P.parse_port_attrs(rec("ssh_merged_grep_interleaved.txt"), noise)
    assert ports["lo"].carrier is None  # honestly unknown, not guessed
    assert any("ifb0/carrier/sys/class/net/lo/carrier:1" in n for n in noise)


def test_is_active() -> None:
    assert P.parse_is_active("active\n", 0) == "active"
    assert P.parse_is_active("inactive\n", 3) == "inactive"
    with pytest.raises(P.ParseError, match="System has not been booted"):
        P.parse_is_active(rec("systemctl_no-systemd.txt"), 1)


def test_swapon_zram_and_escaped_names() -> None:
    devs = P.parse_swapon(rec("swapon_zram.txt"))
    assert [(d.name, d.type, d.size, d.prio) for d in devs] == [
        ("/dev/zram0", "partition", 4118450176, 5),
        ("/dev/zram1", "partition", 4118450176, 5),
        ("/swap file", "file", 2147479552, -2),
    ]
    assert P.parse_swapon("") == []


def test_ps() -> None:
    procs = P.parse_ps(rec("ps_desktop_ollama.txt"))
    assert procs[3].pid == 1901 and procs[3].exe == "ollama"
    assert procs[1].args == "[kthreadd]"
