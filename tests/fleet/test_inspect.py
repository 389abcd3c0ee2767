"""``alma fleet inspect``: only allow-listed read-only commands; verified vs not checked."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from alma.fleet import inspect as I
from alma.fleet.inventory import Fleet, Node, parse_fleet
from alma.fleet.ssh import RemoteResult

REC = Path(__file__).parent / "recorded"
NOW = datetime(2026, 11, 30, 16, 0, 0, tzinfo=UTC)
FLEET_TOML = """
[[node]]
name = "orin-01"
role = "board"
reserve = "4GiB"
links = [{ iface = "enP8p1s0", speed = 10000 }, { iface = "eth0", speed = 10000 }, { iface = "eth1" },
         { iface = "eth9", speed = 25000 }]
[[node]]
name = "orin-02"
role = "cluster"
"""


def rec(name: str) -> list[str]:
    return (REC / name).read_text().splitlines()


ORIN_ANSWERS = {
    I.DATE: (0, ["2026-11-30T16:00:01Z"]),
    I.FREE: (0, rec("free-b_orin-agx-64g_jetpack6.txt")),
    I.GPU_APPS_COMMAND: (0, rec("nvidia-smi_compute-apps_orin.txt")),
    I.EARLYOOM: (3, ["inactive"]),
    I.SWAPON: (0, rec("swapon_zram.txt")),
    I.IP_BRIEF: (0, rec("ip-br-4_address.txt")),
    I.RDMA: (127, rec("sh_rdma_not-found_dash.txt")),
    I.PORTS: (2, rec("sysfs_ports_grep-s.txt")),
}


def fake_remote(answers: dict[str, dict[str, tuple[int, list[str]]]], sent: list[tuple[str, str]]):  # type: ignore[no-untyped-def]
    def remote(node: Node, command: str, cfg: object, *, timeout: float, cancel: object, **_: object) -> RemoteResult:
        sent.append((node.name, command))
        if node.name not in answers:
            return RemoteResult(
                node.name,
                command,
                255,
                ["ssh: connect to host x port 22: Connection refused"],
                0.01,
                error="unreachable",
            )
        rc, lines = answers[node.name][command]
        return RemoteResult(node.name, command, rc, lines, 0.05)

    return remote


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return parse_fleet(FLEET_TOML, tmp_path / "fleet.toml")


def test_only_allow_listed_commands_are_sent(fleet: Fleet) -> None:
    sent: list[tuple[str, str]] = []
    I.collect(fleet, list(fleet.nodes), remote=fake_remote({"orin-01": ORIN_ANSWERS}, sent), clock=lambda: NOW)
    assert {c for _, c in sent} == set(I.ALLOWED_COMMANDS)
    assert len(sent) == 2 * len(I.ALLOWED_COMMANDS)
    # and the list itself only reads: no redirection, no chaining, no known mutating verb
    for cmd in I.ALLOWED_COMMANDS:
        assert not any(tok in cmd for tok in (">", ";", "&", "|", "`", "$(", "\n")), cmd
        assert cmd.split()[0] in {"date", "free", "nvidia-smi", "systemctl", "swapon", "ip", "rdma", "grep"}
        assert not any(w in cmd.split() for w in ("start", "stop", "restart", "set", "add", "del", "-w", "-i"))


def test_anything_else_is_refused_before_ssh(fleet: Fleet) -> None:
    sent: list[tuple[str, str]] = []
    remote = fake_remote({"orin-01": ORIN_ANSWERS}, sent)
    import alma.runner as runner

    for bad in ("reboot", "free -b; reboot", "systemctl stop earlyoom", I.FREE + " "):
        with pytest.raises(I.NotAllowed):
            I._send(fleet.nodes[0], bad, fleet, 1.0, runner.Deadline(None), remote)
    assert sent == []


def test_interpret_orin(fleet: Fleet) -> None:
    sent: list[tuple[str, str]] = []
    started, (orin, dead) = I.collect(
        fleet, list(fleet.nodes), remote=fake_remote({"orin-01": ORIN_ANSWERS}, sent), clock=lambda: NOW
    )
    v = orin.verified
    assert v["memory"]["capacity_bytes"] == 56175583232 == v["memory"]["available_bytes"]
    assert v["budget"]["budget_bytes"] == 56175583232 - (4 << 30)
    assert v["gpu_processes"] == [{"pid": 3187, "name": "/usr/bin/python3", "used_bytes": None, "reported_as": "[N/A]"}]
    assert v["earlyoom"] == "inactive"  # exit 3 is an answer, not a failure
    assert [d["name"] for d in v["swap"]["devices"]] == ["/dev/zram0", "/dev/zram1", "/swap file"]
    fabric = {f["iface"]: f for f in v["fabric"]}
    assert fabric["enP8p1s0"]["problem"] is None and fabric["enP8p1s0"]["speed"] == 10000
    assert fabric["eth0"]["problem"] == "negotiated 1000 Mb/s, expected 10000 Mb/s"
    assert fabric["eth1"]["problem"] == "no carrier"
    assert fabric["eth9"]["present"] is False and "not proof" in fabric["eth9"]["problem"]
    assert {"item": "RDMA links", "reason": "rdma not installed"} in orin.not_checked
    assert orin.node_clock == "2026-11-30T16:00:01Z" and orin.verified_at == "2026-11-30T16:00:00Z"
    assert orin.reachable and not dead.reachable
    assert dead.not_checked[0]["item"] == "everything" and "Connection refused" in dead.not_checked[0]["reason"]

    md = I.to_markdown(started, [orin, dead])
    assert "### Verified live at 2026-11-30T16:00:00Z (node clock 2026-11-30T16:00:01Z)" in md
    assert "memory not reported (\\[N/A])" in md  # "[" escaped: node text never opens a link
    assert "- RDMA links: rdma not installed" in md
    assert "never summed" in md.lower() or "**never summed**" in md
    assert "## orin-02 (cluster)" in md and "node not reached" in md
    # budgets are per node: no total anywhere
    doc = I.to_json(started, [orin, dead])
    assert "total_budget" not in json.dumps(doc) and "budget" not in doc


def test_failures_are_named_with_why(fleet: Fleet) -> None:
    answers = dict(ORIN_ANSWERS)
    answers[I.EARLYOOM] = (1, rec("systemctl_no-systemd.txt"))
    answers[I.RDMA] = (1, rec("rdma_no-netlink.txt"))
    answers[I.GPU_APPS_COMMAND] = (9, rec("nvidia-smi_no-driver.txt"))
    answers[I.FREE] = (0, rec("free-b_procps-3.3.9_no-available.txt"))
    _, (orin,) = I.collect(fleet, [fleet.nodes[0]], remote=fake_remote({"orin-01": answers}, []), clock=lambda: NOW)
    reasons = {x["item"]: x["reason"] for x in orin.not_checked}
    assert "Failed to connect to bus" in reasons["earlyoom"]
    assert "Failed to open NETLINK_RDMA socket" in reasons["RDMA links"]
    assert "couldn't communicate with the NVIDIA driver" in reasons["GPU compute processes"]
    assert "available" in reasons["memory"] and reasons["budget"] == "memory not verified"
    failed = {x["command"] for x in orin.failed_commands}
    assert {I.EARLYOOM, I.RDMA, I.GPU_APPS_COMMAND, I.FREE} <= failed
    assert "memory" not in orin.verified and "budget" not in orin.verified


def test_login_shell_noise_is_reported_not_parsed(fleet: Fleet) -> None:
    noise = "rm: cannot remove '/root/.pyenv/shims/tmp.ssLLcJW1hv': No such file or directory"
    answers = {k: (rc, [noise, *lines]) for k, (rc, lines) in ORIN_ANSWERS.items()}
    started, (orin,) = I.collect(
        fleet, [fleet.nodes[0]], remote=fake_remote({"orin-01": answers}, []), clock=lambda: NOW
    )
    assert orin.verified["memory"]["available_bytes"] == 56175583232
    assert [a["iface"] for a in orin.verified["addresses"]] == ["lo", "eth0", "enP8p1s0"]
    assert orin.node_clock == "2026-11-30T16:00:01Z"
    assert {x["command"] for x in orin.ignored_output} >= {I.IP_BRIEF, I.PORTS, I.SWAPON, I.GPU_APPS_COMMAND}
    assert all(x["lines"] == [noise] for x in orin.ignored_output)
    md = I.to_markdown(started, [orin])
    assert "### Ignored output" in md and "tmp.ssLLcJW1hv" in md


BANNER = "Welcome` ![x](http://evil.example/x.png) <img src=x onerror=alert(1)> [click](http://evil.example) ``"


def test_a_login_banner_cannot_inject_markdown_or_html(fleet: Fleet) -> None:
    """A banner with a backtick broke out of its code span: live image links and
    raw <img onerror>. Rendered by a REAL CommonMark + GFM-table parser (markdown-it-py)."""
    from markdown_it import MarkdownIt

    answers = {k: (rc, [BANNER, *lines]) for k, (rc, lines) in ORIN_ANSWERS.items()}
    answers[I.EARLYOOM] = (3, [BANNER + " | x"])  # table cell text, not a code span
    sent: list[tuple[str, str]] = []
    started, results = I.collect(fleet, [fleet.node("orin-01")], remote=fake_remote({"orin-01": answers}, sent))
    md = I.to_markdown(started, results)
    html = MarkdownIt("commonmark").enable("table").render(md)
    assert "<img" not in html and "<a " not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html  # shown as text, not dropped
    assert html.count("<code>") >= 1 and "Welcome` ![x]" in html  # the banner inside ONE code span


@pytest.mark.parametrize("text", ["a", "`", "a`b", "``x``", " lead", "trail`", "x" * 10 + "`" * 7])
def test_code_spans_fence_any_backticks(text: str) -> None:
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").render(f"- {I._code(text)}")
    import html as h

    inner = html.split("<code>", 1)[1].split("</code>", 1)[0]
    assert h.unescape(inner) == text
