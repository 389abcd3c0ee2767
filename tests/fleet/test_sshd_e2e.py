"""End to end over a REAL sshd on loopback: real ssh, real remote commands, real timeouts."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from support import REPO, wait_for
from support_fleet import HEALTH, Sshd
from support_guard import FakeBoard, orin_zones

from alma.fleet import inspect as I

pytestmark = pytest.mark.slow
ALMA = [sys.executable, "-m", "alma"]


def alma(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ALMA, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def fleet_file(tmp: Path, sshd: Sshd, nodes: list[tuple[str, str, str]], extra: str = "") -> Path:
    """nodes: (name, role, health_command)."""
    body = f'[ssh]\nconfig = "{sshd.client_config}"\nconnect_timeout = 15\n[health]\ntimeout = 20\n{extra}\n'
    for name, role, cmd in nodes:
        body += f'\n[[node]]\nname = "{name}"\nrole = "{role}"\nhealth_command = {json.dumps(cmd)}\n'
    p = tmp / "fleet.toml"
    p.write_text(body)
    return p


def test_unreachable_and_hanging_nodes_are_unknown(sshd: Sshd, tmp_path: Path) -> None:
    f = fleet_file(
        tmp_path,
        sshd,
        [("dead-node", "board", "true"), ("node-hang", "cluster", "sleep 600")],
    )
    t0 = time.monotonic()
    r = alma(
        "fleet", "health", "--fleet", str(f), "--json", "--timeout", "2", "--snapshot", str(tmp_path / "s.json"),
        timeout=300,
    )  # fmt: skip
    took = time.monotonic() - t0
    assert r.returncode == 3, r.stderr
    data = json.loads(r.stdout)
    by = {n["name"]: n for n in data["nodes"]}
    assert by["dead-node"]["status"] == "UNKNOWN" and "Connection refused" in by["dead-node"]["summary"]
    assert by["node-hang"]["status"] == "UNKNOWN" and "timed out" in by["node-hang"]["summary"]
    assert took < 120, took  # the 600 s hang was cut at its 2 s timeout (start-up and load allowed)
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
        f'[ssh]\nconfig = "{sshd.client_config}"\nconnect_timeout = 15\n'
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
    assert "fabric" in n1["verified"], (n1["not_checked"], n1["failed_commands"])
    fabric = {x["iface"]: x for x in n1["verified"]["fabric"]}
    # ground truth: this machine's own sysfs (the "node" is this machine)
    try:
        want = Path("/sys/class/net/lo/carrier").read_text().strip() == "1"
    except OSError:  # EINVAL while lo is down
        want = None
    assert fabric["lo"]["present"] and fabric["lo"]["carrier"] is want, (fabric, n1["commands"], n1["not_checked"])
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
            "checks": [{"name": "disk", "status": "OK", "summary": "/ 40 GiB free", "perfdata": []}],
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


# ---- the real on-board alma-health as several nodes, each on its own fake board tree ----


def health_cmd(root: Path) -> str:
    """What a board runs, pointed at a fake tree (tools/guard/alma-health, stdlib only)."""
    return f"python3 {HEALTH} --root {root} --json"


def board(root: Path, *, temp: float = 50.0) -> FakeBoard:
    b = FakeBoard(root)
    orin_zones(b, temp)
    b.add_iface("eth1", multicast=0, rx_packets=0, carrier=1, speed=10000)
    b.set_meminfo(total_kb=32_000_000, avail_kb=20_000_000)
    b.set_psi(0.0, 0.0)
    b.add_watchdog()
    b.write_guard_state(shedding=False)
    # The disk check reads the real filesystem under the tree: do not let the host's
    # free space decide a node's colour.
    b.write_config("health.toml", "[disk]\nwarn_pct = 0.0\ncrit_pct = 0.0\n")
    return b


@pytest.fixture
def boards(tmp_path: Path) -> dict[str, Path]:
    ok = board(tmp_path / "ok")
    warn = board(tmp_path / "warn")
    warn.write_guard_state(shedding=True, reason="tj-thermal 91.2 C >= shed 85.0 C")
    crit = board(tmp_path / "crit")
    crit.set_meminfo(total_kb=32_000_000, avail_kb=600_000)  # 1.9 % available
    return {"ok": ok.root, "warn": warn.root, "crit": crit.root}


@pytest.mark.parametrize(
    ("mix", "code", "status"),
    [
        (("ok",), 0, "OK"),
        (("ok", "dead"), 3, "UNKNOWN"),
        (("ok", "warn", "dead"), 1, "WARNING"),
        (("ok", "warn", "crit", "dead"), 2, "CRITICAL"),
    ],
)
def test_real_alma_health_over_real_sshd(
    sshd: Sshd, boards: dict[str, Path], tmp_path: Path, mix: tuple[str, ...], code: int, status: str
) -> None:
    nodes = []
    for i, kind in enumerate(mix):
        if kind == "dead":
            nodes.append(("dead-node", "board", "alma-health --json"))
        else:
            nodes.append((f"node-{kind}{i}", "board", health_cmd(boards[kind])))
    f = fleet_file(tmp_path, sshd, nodes)
    snap = tmp_path / "snap.json"
    r = alma("fleet", "health", "--fleet", str(f), "--json", "--snapshot", str(snap))
    assert r.returncode == code, r.stdout + r.stderr
    data = json.loads(r.stdout)
    assert data["status"] == status
    by = {n["name"]: n for n in data["nodes"]}
    for name, n in by.items():
        want = {"ok": "OK", "warn": "WARNING", "crit": "CRITICAL", "dead": "UNKNOWN"}[
            "dead" if name == "dead-node" else name[5:-1]
        ]
        assert n["status"] == want, n
        if name != "dead-node":
            assert {c["name"] for c in n["checks"]} >= {"storm", "memory", "gpu", "thermal", "links", "disk"}
    if "crit" in mix:
        crit = next(n for n in data["nodes"] if n["name"].startswith("node-crit"))
        mem = next(c for c in crit["checks"] if c["name"] == "memory")
        assert mem["status"] == "CRITICAL" and "MemAvailable" in mem["summary"]
    assert json.loads(snap.read_text()) == data  # the panel's snapshot is what was printed


def test_nagios_and_table_from_real_nodes(sshd: Sshd, boards: dict[str, Path], tmp_path: Path) -> None:
    f = fleet_file(
        tmp_path,
        sshd,
        [("node-a", "board", health_cmd(boards["ok"])), ("node-b", "cluster", health_cmd(boards["warn"]))],
    )
    r = alma("fleet", "health", "--fleet", str(f), "--nagios", "--no-save")
    assert r.returncode == 1
    (line,) = r.stdout.splitlines()
    text, perf = line.split(" | ")
    assert text.startswith("FLEET WARNING - 2 nodes: 0 critical, 1 warning, 0 unknown, 1 ok; node-b WARNING: thermal")
    assert "'node-a/mem_available_pct'=62.5%;10:;5:;0;100" in perf.split()  # lower-bound thresholds as N: ranges
    plain = alma("fleet", "health", "--fleet", str(f), "--no-save")
    assert plain.returncode == 1
    lines = plain.stdout.splitlines()
    assert lines[0].split()[:5] == ["node", "role", "status", "storm", "memory"]
    assert lines[-1].startswith("fleet: WARNING (exit 1)")


def test_fleet_health_shows_each_boards_ota_certificate_expiry(sshd: Sshd, tmp_path: Path) -> None:
    """Once a board's OTA certificate expires it refuses every .swu: the fleet sees it coming."""
    from support_update import make_cert

    roots = {}
    for name, days, since in (("node-fresh", 365, 1), ("node-soon", 11, 1)):
        b = board(tmp_path / name)
        pem, _ = make_cert(tmp_path / f"{name}-cert", days=days, since_days=since)
        (b.root / "etc/alma").mkdir(parents=True, exist_ok=True)
        (b.root / "etc/alma/ota-cert.pem").write_bytes(pem)
        (b.root / "etc/alma/ota.json").write_text('{"cert": "/etc/alma/ota-cert.pem"}')
        roots[name] = b.root
    f = fleet_file(tmp_path, sshd, [(n, "board", health_cmd(r)) for n, r in roots.items()])
    r = alma("fleet", "health", "--fleet", str(f), "--json", "--no-save")
    assert r.returncode == 1, r.stdout + r.stderr
    by = {n["name"]: {c["name"]: c for c in n["checks"]} for n in json.loads(r.stdout)["nodes"]}
    assert by["node-fresh"]["ota_cert"]["status"] == "OK"
    soon = by["node-soon"]["ota_cert"]
    assert soon["status"] == "WARNING" and "expires on" in soon["summary"] and "in 9 days" in soon["summary"]  # 9.99
    plain = alma("fleet", "health", "--fleet", str(f), "--no-save")
    assert "ota_cert" in plain.stdout.splitlines()[0].split()  # a column of its own


def test_stale_report_from_the_real_tool_is_unknown(sshd: Sshd, boards: dict[str, Path], tmp_path: Path) -> None:
    report = subprocess.run(
        [sys.executable, str(HEALTH), "--root", str(boards["ok"]), "--json"], capture_output=True, text=True
    )
    assert report.returncode == 0, report.stdout + report.stderr
    saved = tmp_path / "saved.json"
    saved.write_text(report.stdout)
    f = fleet_file(tmp_path, sshd, [("node-old", "board", f"cat {saved}")], extra="stale_after = 1")
    time.sleep(2.2)
    r = alma("fleet", "health", "--fleet", str(f), "--json", "--no-save")
    assert r.returncode == 3
    (n,) = json.loads(r.stdout)["nodes"]
    assert n["status"] == "UNKNOWN" and n["summary"].startswith("stale report: taken at")


def test_control_persist_reuses_one_connection(sshd: Sshd, boards: dict[str, Path], tmp_path: Path) -> None:
    cm = Path("/tmp") / f"alma-cm-{os.getpid()}"  # short: a unix socket path has ~100 bytes
    f = fleet_file(tmp_path, sshd, [("node-a", "board", health_cmd(boards["ok"]))])
    f.write_text(f.read_text().replace("[health]", f'control_persist = 20\ncontrol_dir = "{cm}"\n[health]'))
    try:
        for _ in range(2):
            r = alma("fleet", "health", "--fleet", str(f), "--json", "--no-save")
            assert r.returncode == 0, r.stdout + r.stderr
        (sock,) = list(cm.iterdir())
        check = subprocess.run(
            ["ssh", "-F", str(sshd.client_config), "-o", f"ControlPath={sock}", "-O", "check", "node-a"],
            capture_output=True,
            text=True,
        )
        assert check.returncode == 0 and "Master running" in check.stderr
    finally:
        for sock in cm.iterdir() if cm.exists() else ():
            subprocess.run(["ssh", "-F", str(sshd.client_config), "-o", f"ControlPath={sock}", "-O", "exit", "node-a"],
                           capture_output=True)  # fmt: skip
        shutil.rmtree(cm, ignore_errors=True)


def _running(argv: list[str]) -> int:
    """How many processes on this host run exactly ``argv``."""
    want = "\0".join(argv).encode() + b"\0"
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            n += Path(f"/proc/{pid}/cmdline").read_bytes() == want
        except OSError:
            continue
    return n


def test_ctrl_c_stops_every_call_and_exits_130(sshd: Sshd, tmp_path: Path) -> None:
    # a duration of this test's own, so its remote commands can be told from every other test's
    hang = ["sleep", f"600.{uuid.uuid4().int % 10**6:06d}"]
    f = fleet_file(tmp_path, sshd, [("node-h1", "board", " ".join(hang)), ("node-h2", "board", " ".join(hang))])
    proc = subprocess.Popen(
        [*ALMA, "fleet", "health", "--fleet", str(f), "--no-save", "--timeout", "300"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # both ssh calls connected and their commands running (a fixed sleep here was not enough
    # under load: the interrupt landed while Python was still importing)
    wait_for(lambda: _running(hang) == 2 or proc.poll() is not None, 120, "both nodes' commands running")
    assert proc.poll() is None, proc.communicate()
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, out + err
    assert "interrupted" in err
    assert time.monotonic() - t0 < 120  # ended by the interrupt, not the 300 s per-node timeout nor the sleep
    assert out == ""  # no half table


# ---- hostile nodes -------------------------------------------------------------

PEAK_RSS = """
import json, resource, subprocess, sys, time
t0 = time.monotonic()
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(json.dumps({"wall": time.monotonic() - t0, "rc": r.returncode, "out": r.stdout, "err": r.stderr,
                  "rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def test_3gb_flood_node_ends_in_time_with_bounded_memory(sshd: Sshd, boards: dict[str, Path], tmp_path: Path) -> None:
    f = fleet_file(
        tmp_path,
        sshd,
        [("node-flood", "board", "cat /dev/zero"), ("node-ok", "board", health_cmd(boards["ok"]))],
    )
    argv = [*ALMA, "fleet", "health", "--fleet", str(f), "--json", "--no-save", "--timeout", "5"]
    r = subprocess.run([sys.executable, "-c", PEAK_RSS, *argv], capture_output=True, text=True, timeout=120, cwd=REPO)
    got = json.loads(r.stdout)
    # An endless flood: only the 1 MiB cap or the 5 s deadline ends it; the bound (start-up
    # included) holds at load 30 on 2 cores, and the subprocess timeout catches a hang.
    assert got["wall"] < 60, got["wall"]
    assert got["rss_mb"] < 100, got["rss_mb"]  # peak RSS of the largest child: alma (or ssh)
    by = {n["name"]: n for n in json.loads(got["out"])["nodes"]}
    assert by["node-flood"]["status"] == "UNKNOWN" and "output over limit" in by["node-flood"]["summary"]
    assert by["node-ok"]["status"] == "OK"
    assert got["rc"] == 3


def _procs_with(marker: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("command", ["sleep 297.4{n}", "trap '' TERM HUP; sleep 296.4{n}; sleep 1"])
def test_nothing_of_a_timed_out_run_remains_on_the_node(sshd: Sshd, tmp_path: Path, command: str) -> None:
    """sshd does not stop a command when the client goes away: the node's own deadline must."""
    marker = command.split("sleep ", 1)[1].split(";")[0].format(n=os.getpid())
    cmd = command.format(n=os.getpid())
    f = fleet_file(tmp_path, sshd, [("node-hang", "board", cmd)])
    try:
        t0 = time.monotonic()
        r = alma("fleet", "health", "--fleet", str(f), "--json", "--no-save", "--timeout", "2")
        assert r.returncode == 3 and time.monotonic() - t0 < 120  # not the ~300 s command
        assert "timed out" in json.loads(r.stdout)["nodes"][0]["summary"]
        deadline = time.monotonic() + 60  # remote deadline 2 s + SIGKILL 2 s later + load
        while _procs_with(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _procs_with(marker) == [], "the timed-out remote command is still running"
    finally:
        for pid in _procs_with(marker):  # only what this test started, found by its marker
            os.kill(pid, signal.SIGKILL)


def test_forged_report_before_the_real_one_over_ssh(sshd: Sshd, boards: dict[str, Path], tmp_path: Path) -> None:
    forged = '{"schema":"alma.health/1","status":"OK","checks":[],"time":"2030-01-01T00:00:00Z"}'
    cmd = f"echo '{forged}'; {health_cmd(boards['crit'])}"
    f = fleet_file(tmp_path, sshd, [("node-forge", "board", cmd)])
    r = alma("fleet", "health", "--fleet", str(f), "--json", "--no-save")
    (n,) = json.loads(r.stdout)["nodes"]
    assert r.returncode == 3 and n["status"] == "UNKNOWN" and "two reports" in n["summary"]


def test_escapes_from_a_node_never_reach_the_terminal(sshd: Sshd, tmp_path: Path) -> None:
    rep = {
        "schema": "alma.health/1", "status": "WARNING", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "checks": [{"name": "disk\x1b]0;t\x07", "status": "WARNING", "summary": "\x1b[2J\x1b]8;;http://x\x1b\\y\r",
                    "perfdata": [{"label": "a\nb|c", "value": 7.5}]},
                   {"name": "memory", "status": "OK", "summary": "ok"}],  # an expected check beside it
    }  # fmt: skip
    rj = tmp_path / "r.json"
    rj.write_text(json.dumps(rep).replace("7.5", "1e400"))  # valid JSON, not a finite float
    f = fleet_file(tmp_path, sshd, [("node-esc", "board", f"cat {rj}")])
    for fmt in ([], ["--nagios"], ["--json"]):
        r = alma("fleet", "health", "--fleet", str(f), "--no-save", *fmt)
        assert r.returncode == 1, r.stdout + r.stderr
        assert not any(c in r.stdout for c in "\x1b\x07\r\x9b"), (fmt, r.stdout)
        if fmt == ["--nagios"]:
            (line,) = r.stdout.splitlines()
            assert line.count("|") == 1 and "e+" not in line and "inf" not in line


def test_each_run_is_appended_to_the_history_beside_the_snapshot(
    sshd: Sshd, boards: dict[str, Path], tmp_path: Path
) -> None:
    import sqlite3

    f = fleet_file(tmp_path, sshd, [("node-a", "board", health_cmd(boards["ok"])), ("dead-node", "board", "true")])
    snap = tmp_path / "state" / "fleet-health.json"
    for _ in range(2):
        r = alma("fleet", "health", "--fleet", str(f), "--json", "--snapshot", str(snap))
        assert r.returncode == 3, r.stderr
    db = snap.with_name("fleet-history.sqlite")
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 2
        rows = conn.execute("SELECT node, status FROM node_state ORDER BY node")
        assert list(rows) == [("dead-node", "UNKNOWN"), ("node-a", "OK")]
    other = tmp_path / "elsewhere.sqlite"
    r = alma("fleet", "health", "--fleet", str(f), "--no-save", "--history", str(other))
    assert not other.exists()  # --no-save saves neither
    r = alma("fleet", "health", "--fleet", str(f), "--snapshot", str(snap), "--history", str(other))
    assert other.exists() and r.returncode == 3
    out = tmp_path / "site"
    p = alma("panel", "--fleet", str(f), "--snapshot", str(snap), "--out", str(out))
    assert p.returncode == 0, p.stderr
    st = json.loads((out / "status.json").read_text())
    assert [n["alias"] for n in st["nodes"]] == ["Node 1", "Node 2"]  # no aliases configured: no names either
    assert st["nodes"][0]["uptime_percent"]["24h"] == 100.0 and st["nodes"][1]["uptime_percent"]["24h"] == 0.0
    for name in ("node-a", "dead-node"):
        assert all(name not in x.read_text() for x in out.rglob("*") if x.is_file())


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as fh:  # a zombie is gone too (only not yet reaped)
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        time.sleep(0.1)
    return False


def test_a_remote_child_that_calls_setsid_ends_at_the_deadline(sshd: Sshd, tmp_path: Path) -> None:
    """A remote child that called setsid() (or outlived its parent) escaped the
    remote `timeout`. Over a REAL sshd: both end, by the deadline and when the command ends."""
    hang = tmp_path / "hang.pid"
    left = tmp_path / "left.pid"
    f = fleet_file(tmp_path, sshd, [
        # setsid: a new session AND process group, out of coreutils timeout's reach
        ("node-hang", "board", f"setsid sh -c 'echo $$ > {hang}; exec sleep 300' & sleep 300"),
        # the command exits at once; its child would live on after it
        ("node-left", "board", f"(setsid sh -c 'echo $$ > {left}; exec sleep 300' &); sleep 1; echo done"),
    ])  # fmt: skip
    # 10 s: the deadline also covers ssh's login and the reaper's start; at load 27 on two
    # cores 3 s ended some runs before the command had started (no pid file to check)
    r = alma("fleet", "health", "--fleet", str(f), "--json", "--timeout", "10", "--no-save")
    assert r.returncode == 3, r.stderr
    pids = {}
    for p in (hang, left):
        for _ in range(50):
            if p.exists() and p.read_text().strip():
                break
            time.sleep(0.1)
        pids[p.name] = int(p.read_text())
    try:
        assert _gone(pids["hang.pid"], 10), "the setsid child outlived the deadline"
        assert _gone(pids["left.pid"], 10), "the orphaned child outlived its command"
    finally:
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
