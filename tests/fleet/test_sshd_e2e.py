"""End to end over a REAL sshd on loopback: real ssh, real remote commands, real timeouts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import IN_CI, REPO
from support_fleet import HEALTH, Sshd

from alma.fleet import inspect as I

pytestmark = pytest.mark.slow
ALMA = [sys.executable, "-m", "alma"]


def alma(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ALMA, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def fleet_file(tmp: Path, sshd: Sshd, nodes: list[tuple[str, str, str]], extra: str = "") -> Path:
    """nodes: (name, role, health_command)."""
    body = f'[ssh]\nconfig = "{sshd.client_config}"\nconnect_timeout = 3\n[health]\ntimeout = 10\n{extra}\n'
    for name, role, cmd in nodes:
        body += f'\n[[node]]\nname = "{name}"\nrole = "{role}"\nhealth_command = {json.dumps(cmd)}\n'
    p = tmp / "fleet.toml"
    p.write_text(body)
    return p


def test_unreachable_and_hanging_nodes_are_unknown(sshd: Sshd, tmp_path: Path) -> None:
    f = fleet_file(
        tmp_path,
        sshd,
        [("dead-node", "board", "true"), ("node-hang", "cluster", "sleep 30")],
    )
    t0 = time.monotonic()
    r = alma("fleet", "health", "--fleet", str(f), "--json", "--timeout", "2", "--snapshot", str(tmp_path / "s.json"))
    took = time.monotonic() - t0
    assert r.returncode == 3, r.stderr
    data = json.loads(r.stdout)
    by = {n["name"]: n for n in data["nodes"]}
    assert by["dead-node"]["status"] == "UNKNOWN" and "Connection refused" in by["dead-node"]["summary"]
    assert by["node-hang"]["status"] == "UNKNOWN" and "timed out" in by["node-hang"]["summary"]
    assert took < 15, took  # the hang was cut at its timeout, not waited out
    assert json.loads((tmp_path / "s.json").read_text())["code"] == 3


def test_host_key_mismatch_is_unknown_never_prompted(sshd: Sshd, tmp_path: Path) -> None:
    cfg = tmp_path / "ssh_config"
    bad_known = tmp_path / "known_hosts"
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    pub = other.with_suffix(".pub").read_text().split()
    bad_known.write_text(f"[127.0.0.1]:{sshd.port} {pub[0]} {pub[1]}\n")
    cfg.write_text(sshd.client_config.read_text().replace(str(sshd.known_hosts), str(bad_known)))
    f = tmp_path / "fleet.toml"
    f.write_text(f'[ssh]\nconfig = "{cfg}"\n[[node]]\nname = "node-x"\nrole = "board"\nhealth_command = "true"\n')
    r = alma("fleet", "health", "--fleet", str(f), "--json", "--no-save", "--timeout", "10")
    assert r.returncode == 3
    (node,) = json.loads(r.stdout)["nodes"]
    assert "Host key verification failed" in node["summary"]


def test_inspect_real_node_over_ssh(sshd: Sshd, tmp_path: Path) -> None:
    f = tmp_path / "fleet.toml"
    f.write_text(
        f'[ssh]\nconfig = "{sshd.client_config}"\n'
        '[[node]]\nname = "node-1"\nrole = "board"\nreserve = "1GiB"\nlinks = [{ iface = "lo" }, { iface = "nope9" }]\n'
        '[[node]]\nname = "dead-node"\nrole = "board"\n'
    )
    out = tmp_path / "inspect.json"
    r = alma("fleet", "inspect", "node-1", "dead-node", "--fleet", str(f), "--json", "--out", str(out))
    assert r.returncode == 3, r.stderr  # one node unreachable
    doc = json.loads(out.read_text())
    n1, dead = doc["nodes"]
    assert doc["read_only_commands"] == list(I.ALLOWED_COMMANDS)
    mem = n1["verified"]["memory"]
    assert 0 < mem["available_bytes"] <= mem["total_bytes"]
    assert n1["verified"]["budget"]["budget_bytes"] == mem["available_bytes"] - (1 << 30)
    assert n1["node_clock"] and n1["node_clock"].endswith("Z")
    assert any(a["iface"] == "lo" and "127.0.0.1/8" in a["addresses"] for a in n1["verified"]["addresses"])
    fabric = {x["iface"]: x for x in n1["verified"]["fabric"]}
    assert fabric["lo"]["present"] and fabric["lo"]["carrier"] is True, (fabric, n1["commands"], n1["not_checked"])
    assert fabric["nope9"]["present"] is False
    items = {x["item"]: x["reason"] for x in n1["not_checked"]}
    # This machine: no GPU driver, maybe no systemd/RDMA; whatever is missing is named, never invented.
    if not shutil.which("nvidia-smi"):
        assert items["GPU compute processes"] == "nvidia-smi not installed"
    for item in ("RDMA links", "earlyoom"):
        if item in items:
            assert items[item]
        else:
            assert {"RDMA links": "rdma_links", "earlyoom": "earlyoom"}[item] in n1["verified"]
    assert dead["reachable"] is False and "Connection refused" in dead["not_checked"][0]["reason"]
    md = alma("fleet", "inspect", "node-1", "--fleet", str(f))
    assert md.returncode == 0
    assert "### Verified live at" in md.stdout and "### Not checked" in md.stdout


def test_inspect_unknown_node_is_exit_2(sshd: Sshd, tmp_path: Path) -> None:
    f = fleet_file(tmp_path, sshd, [("node-1", "board", "true")])
    r = alma("fleet", "inspect", "node-404", "--fleet", str(f))
    assert r.returncode == 2 and "no node named 'node-404'" in r.stderr and "known nodes: node-1" in r.stderr


def test_desktop_rule_names_a_real_model_server(sshd: Sshd, tmp_path: Path) -> None:
    """A real process whose executable is called `ollama` runs on the 'desktop' node."""
    fake = tmp_path / "bin" / "ollama"
    fake.parent.mkdir()
    shutil.copy("/bin/sleep", fake)
    proc = subprocess.Popen([str(fake), "30"])
    try:
        report = {
            "schema": "alma.health/1",
            "node": "desk",
            "status": "OK",
            "code": 0,
            "checks": [],
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        rj = tmp_path / "report.json"
        rj.write_text(json.dumps(report))
        f = fleet_file(tmp_path, sshd, [("node-desk", "desktop", f"cat {rj}")])
        r = alma("fleet", "health", "--fleet", str(f), "--json", "--no-save")
        assert r.returncode == 2, r.stdout + r.stderr
        (node,) = json.loads(r.stdout)["nodes"]
        rule = next(c for c in node["checks"] if c["name"] == "no-local-ai")
        assert rule["status"] == "CRITICAL" and f"ollama (pid {proc.pid})" in rule["summary"]
    finally:
        proc.kill()
        proc.wait()
    r = alma("fleet", "health", "--fleet", str(f), "--json", "--no-save")
    (node,) = json.loads(r.stdout)["nodes"]
    assert r.returncode == 0, node
    assert node["status"] == "OK"


def require_health() -> Path:
    if not HEALTH.exists():
        msg = f"{HEALTH} (the real on-board alma-health) is not in the tree yet"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return HEALTH
