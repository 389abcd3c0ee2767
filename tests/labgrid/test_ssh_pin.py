"""AlmaSSHDriver against a REAL sshd on loopback: labgrid's SSHDriver would accept any host key
(it passes StrictHostKeyChecking=no); ours connects only to the pinned one."""

from __future__ import annotations

import getpass
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from labgrid import Target
from labgrid.resource import NetworkService
from support_fleet import Sshd, start_sshd, stop_sshd

from alma.errors import UserError
from alma.labgrid import AlmaSSHDriver
from alma.sshkeys import parse_public_key


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    s = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield s
    finally:
        stop_sshd(s)


def _driver(sshd: Sshd, host_key: str | None, name: str, timeout: float = 10.0) -> tuple[Target, Any]:
    """``timeout``: labgrid retries the connection until it runs out. Not larger: labgrid 26's
    activation here took about that long even when the master was up at once (open question)."""
    t = Target(name)
    NetworkService(t, name=None, address="127.0.0.1", port=sshd.port, username=getpass.getuser())
    drv = AlmaSSHDriver(
        t, name=None, keyfile=str(sshd.dir / "id_ed25519"), host_key=host_key, connection_timeout=timeout
    )
    return t, drv


def _cleanup(t: Target, drv: Any) -> None:
    """labgrid's deactivation waits up to 60 s for its keepalive (``ssh ... cat`` through the
    master) to end after closing its stdin; here it never ended sooner. End it first: a test
    that spends a minute in labgrid's teardown is budget spent on nothing."""
    keepalive = getattr(drv, "_keepalive", None)
    if keepalive is not None:
        keepalive.terminate()
    t.cleanup()


def _host_key(sshd: Sshd) -> str:
    return (sshd.dir / "host_ed25519.pub").read_text()


def test_the_pinned_fingerprint_connects(sshd: Sshd) -> None:
    t, drv = _driver(sshd, parse_public_key(_host_key(sshd)).fingerprint, "pinned-fp")
    try:
        t.activate(drv)
        out, _, code = drv.run("echo pinned", timeout=120)  # a loaded host is slow to start a session
        assert (code, out) == (0, ["pinned"])
    finally:
        _cleanup(t, drv)


def test_the_pinned_full_key_connects(sshd: Sshd) -> None:
    t, drv = _driver(sshd, " ".join(_host_key(sshd).split()[:2]), "pinned-key")
    try:
        t.activate(drv)
        assert drv.run_check("echo ok", timeout=120) == ["ok"]
    finally:
        _cleanup(t, drv)


def test_another_fingerprint_is_refused_before_any_login(sshd: Sshd) -> None:
    other = parse_public_key((sshd.dir / "id_ed25519.pub").read_text()).fingerprint  # a real key, not the host's
    t, drv = _driver(sshd, other, "wrong-fp")
    with pytest.raises(UserError, match="no host key with the pinned fingerprint"):
        t.activate(drv)
    t.cleanup()


def test_another_full_key_makes_ssh_refuse(sshd: Sshd, tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    # every attempt fails at once on the host key; labgrid retries for `timeout` and reports the last
    t, drv = _driver(sshd, " ".join((tmp_path / "k.pub").read_text().split()[:2]), "wrong-key", timeout=15.0)
    with pytest.raises(Exception, match="Timeout while waiting for ssh connection") as info:
        t.activate(drv)
    t.cleanup()
    ssh_said = b"\n".join(getattr(info.value.__cause__, "stdout", None) or [])
    assert b"Host key verification failed" in ssh_said, ssh_said


def test_no_pin_no_connection(sshd: Sshd) -> None:
    t, drv = _driver(sshd, None, "unpinned")
    with pytest.raises(UserError, match="no pinned host key"):
        t.activate(drv)
    t.cleanup()
