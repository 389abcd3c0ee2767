"""A REAL OpenSSH server on loopback for the fleet tests and bench/bench_fleet.py.

Debian's /usr/sbin/sshd with temporary host keys, a temporary client key in a temporary
authorized_keys, ``StrictModes no`` and a free port on 127.0.0.1, so it runs as root (CI)
and as a normal user alike. The client side is a real ssh config file passed with ``-F``
(the same path a lab's ~/.ssh/config takes), with a temporary known_hosts holding the
server's host key: StrictHostKeyChecking=yes is really exercised.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from support import DEADLINE_S

REPO = Path(__file__).resolve().parent.parent
AXE_JS = REPO / "build" / "axe" / "node_modules" / "axe-core" / "axe.min.js"  # npm-installed by .ci/run
HEALTH = REPO / "tools" / "guard" / "alma-health"

# 16 bench  "nodes" connect at once; the default MaxStartups 10:30:100 would drop some.
MAX_STARTUPS = "64:30:128"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Sshd:
    port: int
    dir: Path
    client_config: Path
    known_hosts: Path
    dead_port: int  # nothing listens there: "Connection refused"
    proc: subprocess.Popen[bytes]

    def log(self) -> str:
        p = self.dir / "sshd.log"
        return p.read_text(errors="replace") if p.exists() else ""


def start_sshd(base: Path, extra: str = "") -> Sshd:
    """``extra``: more sshd_config lines (tests/update: SetEnv for a simulated board)."""
    keygen = shutil.which("ssh-keygen") or "ssh-keygen"
    base.mkdir(parents=True, exist_ok=True)
    for name in ("host_ed25519", "id_ed25519"):
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-C", "alma-test", "-f", str(base / name)], check=True)
    (base / "authorized_keys").write_text((base / "id_ed25519.pub").read_text())
    port, dead = free_port(), free_port()
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    # Root's shell on a pyenv host runs `pyenv rehash` at every login; a lock left by a killed
    # login makes each later one wait PYENV_REHASH_TIMEOUT (60 s). sshd takes the first SetEnv
    # it reads, so the variable joins the caller's SetEnv line when there is one.
    setenv = "SetEnv PYENV_REHASH_TIMEOUT=1"
    lines = extra.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("SetEnv "):
            lines[i] = setenv + line[len("SetEnv") :]
            break
    else:
        lines.append(setenv + "\n")
    extra = "".join(lines)
    cfg = base / "sshd_config"
    cfg.write_text(
        f"""Port {port}
ListenAddress 127.0.0.1
HostKey {base / "host_ed25519"}
PidFile {base / "sshd.pid"}
AuthorizedKeysFile {base / "authorized_keys"}
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin prohibit-password
MaxStartups {MAX_STARTUPS}
MaxSessions 64
LoginGraceTime 20
LogLevel ERROR
{extra}"""
    )
    hostkey = (base / "host_ed25519.pub").read_text().split()
    known = base / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {hostkey[0]} {hostkey[1]}\n")
    client = base / "ssh_config"
    client.write_text(
        f"""Host node-* bench-*
    HostName 127.0.0.1
    Port {port}
Host dead-node
    HostName 127.0.0.1
    Port {dead}
Host *
    User {getpass.getuser()}
    IdentityFile {base / "id_ed25519"}
    IdentitiesOnly yes
    UserKnownHostsFile {known}
    GlobalKnownHostsFile /dev/null
"""
    )
    return Sshd(port, base, client, known, dead, launch_sshd(base, port))


def launch_sshd(base: Path, port: int) -> subprocess.Popen[bytes]:
    """(Re)start the sshd configured in ``base`` and wait for its banner (a board "booting")."""
    sshd_bin = shutil.which("sshd") or "/usr/sbin/sshd"
    log = open(base / "sshd.log", "ab")  # noqa: SIM115 - closed with the process
    argv = [sshd_bin, "-D", "-e", "-f", str(base / "sshd_config")]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited {proc.returncode}: {(base / 'sshd.log').read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                if s.recv(64).startswith(b"SSH-2.0-"):
                    break
        except OSError:
            time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError("sshd did not start listening within 10 s")
    return proc


def stop_sshd(s: Sshd) -> None:
    s.proc.terminate()
    try:
        s.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        s.proc.kill()
        s.proc.wait()


def chromium(tmp_path: Path, url: str, *extra: str, size: str = "1100,720") -> str:
    """Run REAL headless Chromium on ``url`` (a file: URL); returns its stdout (--dump-dom)."""
    from support import require_tool

    exe = require_tool("chromium")
    argv = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--window-size={size}",
        *extra,
        url,
    ]
    # Headless Chromium now and then hangs on a screenshot under load (seen in CI with four
    # test workers on two cores, the page long rendered): a hang of the browser, not of the
    # page, so a second try in a fresh profile decides; a page that hangs it hangs it twice.
    for attempt in (1, 2):
        profile = f"--user-data-dir={tmp_path / f'chromium-profile-{attempt}'}"
        try:
            r = subprocess.run([profile if a.startswith("--user-data-dir=") else a for a in argv],
                               capture_output=True, text=True, timeout=300)  # fmt: skip
            break
        except subprocess.TimeoutExpired:
            if attempt == 2:
                raise
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@contextlib.contextmanager
def served(out: Path) -> Iterator[str]:
    """``alma panel --serve``'s server over ``out`` on an ephemeral loopback port, in a thread;
    yields its base URL and stops it on the way out."""
    from alma.fleet.serve import serve

    stop = threading.Event()
    urls: list[str] = []
    t = threading.Thread(target=serve, args=(out, "127.0.0.1", 0, 3600, lambda: None, lambda e: None),
                         kwargs={"ready": urls.append, "stop": stop}, daemon=True)  # fmt: skip
    t.start()
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not urls and time.monotonic() < deadline:
            time.sleep(0.05)
        assert urls, "the panel server did not start"
        yield urls[0]
    finally:
        stop.set()
        t.join(timeout=10)
