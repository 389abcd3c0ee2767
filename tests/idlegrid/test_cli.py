"""The eran-grid command: opt-in refusal, one-line status, queue administration, bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
from support import DEADLINE_S


def run(cmd, *args, stdin=None, timeout=60):
    return subprocess.run([*cmd, *args], capture_output=True, input=stdin, timeout=timeout)


@pytest.mark.parametrize("enabled", ["missing", False])
def test_run_refuses_without_the_opt_in(grid, eran_grid_cmd, enabled):
    g = grid()
    g.hashchain(1000)
    cfg = g.config_file(drop=("enabled",)) if enabled == "missing" else g.config_file(enabled=enabled)
    proc = run(eran_grid_cmd, "--config", str(cfg), "run")
    assert proc.returncode == 2
    err = proc.stderr.decode()
    assert "disabled: opt-in required" in err and "try: set `enabled = true`" in err
    assert "Traceback" not in err
    assert g.queue.counts()["queued"] == 1  # nothing claimed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('enabled = "yes"\n', ":1: enabled: must be true or false, not a string"),
        ("enabled = true\nidle_afterr = 5\n", ":2: unknown key(s) in the top level: idle_afterr"),
        ('enabled = true\n[queue]\nbackend = "redis"\n', ':3: queue.backend: must be "sqlite" or "nats"'),
        ("enabled = true\npoll = 30\n", ":2: poll: 30 is out of range (must be >= 0.01 and <= 5)"),
        # accepted before the typed reader: a NaN limit compares false, so 95 C was "ready to work"
        ("enabled = true\n\nmax_temp_c = nan\n", ":3: max_temp_c: must be a finite number"),
        ("enabled = true\n[thermal.zones]\ntj-thermal = inf\n", ":3: thermal.zones.tj-thermal: must be a finite"),
        ("enabled = true\nlease_ttl = 0\n", ":2: lease_ttl: 0 is out of range"),
        ("enabled = true\nmax_failures = 2.5\n", ":2: max_failures: must be an integer"),
        ("enabled = true\nresult_max_bytes = -1\n", ":2: result_max_bytes: -1 is out of range"),
        ("enabled = tru\n", "not valid TOML"),
        ("a = " + "[" * 2000 + "]" * 2000 + "\n", "nested too deeply"),  # RecursionError, not exit 1
    ],
)
def test_bad_config_is_a_clear_error_not_a_traceback(tmp_path, eran_grid_cmd, text, message):
    cfg = tmp_path / "c.toml"
    cfg.write_text(text)
    proc = run(eran_grid_cmd, "--config", str(cfg), "run")
    assert proc.returncode == 2 and message in proc.stderr.decode() and "Traceback" not in proc.stderr.decode()


def test_missing_config_names_the_next_step(tmp_path, eran_grid_cmd):
    proc = run(eran_grid_cmd, "--config", str(tmp_path / "nope.toml"), "status")
    assert proc.returncode == 2 and "try: --config FILE" in proc.stderr.decode()


@pytest.mark.parametrize(
    ("setup", "line", "code"),
    [
        (lambda m: None, re.escape("agent not running; ready to work"), 0),
        (
            lambda m: (m.supply("ADP1", "Mains", online=False), m.supply("BAT0", "Battery", status="Discharging")),
            re.escape("agent not running; on battery"),
            1,
        ),
        (lambda m: m.zone(1, "tj-thermal", 91.0), re.escape("agent not running; hot: tj-thermal 91 °C"), 1),
        # 4.2 s before the command started; a loaded host may take seconds to start it
        (
            lambda m: m.touch_pts(4, time.time() - 4.2),
            r"agent not running; owner active ([4-9]|[1-5]\d) s ago \(pts/4\)",
            1,
        ),
    ],
)
def test_status_line_when_the_agent_is_not_running(grid, machine, eran_grid_cmd, setup, line, code):
    g = grid(idle_after=180.0)
    machine.touch_pts(0, time.time() - 3600)
    setup(machine)
    proc = run(eran_grid_cmd, "--config", str(g.config_file(idle_after=180.0)), "status")
    assert re.fullmatch(line, proc.stdout.decode().strip()) and proc.returncode == code


def test_status_disabled(grid, eran_grid_cmd):
    g = grid()
    proc = run(eran_grid_cmd, "--config", str(g.config_file(enabled=False)), "status", "--json")
    info = json.loads(proc.stdout)
    assert info["line"] == "disabled: opt-in required" and info["working"] is False and proc.returncode == 1


def test_status_coordinator_unreachable(grid, eran_grid_cmd, tmp_path):
    g = grid()
    cfg = g.config_file(queue={"backend": "sqlite", "path": str(tmp_path / "gone" / "q.db")})
    proc = run(eran_grid_cmd, "--config", str(cfg), "status")
    out = proc.stdout.decode().strip()
    assert out.startswith("agent not running; coordinator unreachable since 20") and proc.returncode == 1


def test_status_reports_the_running_agents_own_line(grid, eran_grid_cmd):
    g = grid()
    g.hashchain(50_000_000)
    cfg = g.config_file()
    agent = subprocess.Popen(
        [*eran_grid_cmd, "--config", str(cfg), "run"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            proc = run(eran_grid_cmd, "--config", str(cfg), "status", "--json")
            info = json.loads(proc.stdout)
            if info["line"].startswith("running job"):
                break
            time.sleep(0.1)
        assert info["line"].startswith("running job 1") and info["working"] is True and proc.returncode == 0
        assert info["agent"]["node"] == "node-a"
        agent.terminate()  # SIGTERM: the agent yields the job (checkpoint, requeue) and exits 0
        assert agent.wait(30) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    [row] = g.queue.jobs()
    assert row["state"] == "queued" and row["yields"] == 1 and row["failures"] == 0


def test_submit_results_and_queue_administration(tmp_path, eran_grid_cmd, hashchain_path):
    q = ["--queue-path", str(tmp_path / "q.db")]
    sub = run(
        eran_grid_cmd,
        "submit",
        *q,
        "--name",
        "chain",
        "--input",
        "-",
        "--",
        "python3",
        str(hashchain_path),
        "--steps",
        "10",
        stdin=b"abc",
    )
    assert sub.returncode == 0 and sub.stdout.strip() == b"1"
    listing = run(eran_grid_cmd, "queue", "list", *q, "--json")
    [row] = json.loads(listing.stdout)
    assert row["state"] == "queued" and row["name"] == "chain" and row["command"][0] == "python3"
    assert run(eran_grid_cmd, "queue", "stats", *q).stdout.decode().split()[:2] == ["queued", "1"]
    res = run(eran_grid_cmd, "results", *q, "1")
    assert res.returncode == 1 and b"no result yet" in res.stderr
    bad = run(eran_grid_cmd, "queue", "requeue", *q, "1")
    assert bad.returncode == 2 and b"not dead-lettered" in bad.stderr
    assert run(eran_grid_cmd, "queue", "remove", *q, "1").returncode == 0
    assert json.loads(run(eran_grid_cmd, "queue", "list", *q, "--json").stdout) == []
    assert run(eran_grid_cmd, "queue", "remove", *q).returncode == 2  # needs a JOB


def test_submit_without_a_command_or_with_unreadable_input(tmp_path, eran_grid_cmd):
    q = ["--queue-path", str(tmp_path / "q.db")]
    proc = run(eran_grid_cmd, "submit", *q)
    assert proc.returncode == 2 and b"a job needs a command" in proc.stderr
    proc = run(eran_grid_cmd, "submit", *q, "--input", str(tmp_path / "nope"), "--", "true")
    assert proc.returncode == 2 and b"cannot read input" in proc.stderr
    assert run(eran_grid_cmd, "queue", "stats", *q, "--json").stdout.strip() == (
        b'{"queued": 0, "leased": 0, "done": 0, "dead": 0}'
    )


def test_a_second_agent_on_the_same_state_dir_exits_2_naming_the_holder(grid, eran_grid_cmd):
    """Two real agents, one config: the second must not take the first's running job for a
    crashed run's (it SIGKILLed the job and released the lease)."""
    g = grid()
    job = g.hashchain(50_000_000)
    cfg = g.config_file()
    first = subprocess.Popen(
        [*eran_grid_cmd, "--config", str(cfg), "run"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            [row] = g.queue.jobs()
            if row["state"] == "leased" and (g.cfg.state_dir / "work" / job / "wrapper.json").exists():
                break
            time.sleep(0.1)
        lease = json.loads((g.cfg.state_dir / "work" / job / "lease.json").read_text())
        wrapper = json.loads((g.cfg.state_dir / "work" / job / "wrapper.json").read_text())
        second = run(eran_grid_cmd, "--config", str(cfg), "run")
        assert second.returncode == 2, second.stderr
        err = second.stderr.decode()
        assert f"pid {first.pid}" in err and "agent.lock" in err and "Traceback" not in err
        [row] = g.queue.jobs()
        assert row["state"] == "leased" and row["failures"] == 0  # the lease stands
        assert json.loads((g.cfg.state_dir / "work" / job / "lease.json").read_text()) == lease
        os.kill(int(wrapper["pgid"]), 0)  # the first agent's job is alive
        assert first.poll() is None
        first.terminate()
        assert first.wait(60) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    # The kernel released the lock with the process: the next agent starts (and runs the job).
    again = subprocess.Popen(
        [*eran_grid_cmd, "--config", str(cfg), "run"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and g.queue.jobs()[0]["state"] != "leased":
            time.sleep(0.1)
        assert g.queue.jobs()[0]["state"] == "leased"
    finally:
        again.kill()
        again.wait()


@pytest.fixture
def private_state():
    """The shipped DynamicUser layout: /var/lib/eran-grid is a link into private/, 0700 root's
    (here under a /tmp dir other users can traverse; pytest's own tmp dirs are 0700)."""
    import shutil
    import tempfile
    from pathlib import Path

    base = Path(tempfile.mkdtemp(prefix="i28-private-", dir="/tmp"))
    os.chmod(base, 0o755)
    (base / "private" / "eran-grid").mkdir(parents=True)
    os.chmod(base / "private", 0o700)
    (base / "eran-grid").symlink_to("private/eran-grid")
    yield base / "eran-grid"
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize(
    "verb",
    [("queue", "list"), ("queue", "stats"), ("results",), ("results", "1"), ("queue", "repair"), ("submit",)],
)
def test_a_non_root_user_gets_what_to_run_instead_not_a_traceback(eran_grid_cmd, private_state, verb):
    if os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("needs root (the agent's private state, a second uid) and /usr/bin/python3")
    q = ["--queue-path", str(private_state / "queue.db")]
    assert run(eran_grid_cmd, "submit", *q, "--", "true").returncode == 0  # root may
    args = [*verb, *q, "--", "true"] if verb == ("submit",) else [*verb, *q]
    # /usr/bin/python3: the venv's interpreter may live where a second uid cannot reach.
    other = ["/usr/bin/python3", eran_grid_cmd[-1]]
    proc = subprocess.run([*other, *args], capture_output=True, timeout=60, user=65534, group=65534, extra_groups=[])
    err = proc.stderr.decode()
    assert proc.returncode == 4, err
    assert "Traceback" not in err and "PermissionError" not in err
    assert "sudo eran-grid" in err and str(private_state / "queue.db") in err
