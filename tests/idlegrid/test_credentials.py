"""The queue's credentials live in a file only the agent can read, never in the world-readable
configuration, and never reach a message: a job (another uid) read them from `queue.url` in
/etc/eran-grid/eran-grid.toml (0644), connected as the agent and published forged results.
Real nats-server with user/password authorization on loopback; a real second uid."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from erangrid import cli
from erangrid.config import from_mapping
from erangrid.errors import CoordinatorUnreachable, UserError

SECRET = "s3cr3t-" + uuid.uuid4().hex[:8]


@pytest.fixture
def auth_server(tmp_path: Path, monkeypatch):
    from support import require_tool
    from support_nats import NatsServer

    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    conf = tmp_path / "nats.conf"
    server = NatsServer(require_tool("nats-server"), tmp_path / "js", config=conf)
    conf.write_text(
        f'listen: "127.0.0.1:{server.port}"\n'
        f'jetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
        f'authorization {{ user: "agent", password: "{SECRET}" }}\n'
    )
    server.start()
    yield server
    server.stop()


def _cfg(url: str, creds: Path | None = None):
    queue = {"backend": "nats", "url": url, "stream": "CRED", "connect_timeout": 2.0}
    if creds is not None:
        queue["credentials"] = str(creds)
    return from_mapping({"queue": queue})


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_url_with_credentials_is_refused_without_echoing_them():
    for url in (f"nats://agent:{SECRET}@127.0.0.1:4222", f"nats://{SECRET}@127.0.0.1:4222"):
        with pytest.raises(UserError) as err:
            _cfg(url)
        text = f"{err.value.message} {err.value.hint}"
        assert "must not hold credentials" in text and "queue-credentials" in text
        assert SECRET not in text


def test_the_agent_connects_with_the_credential_systemd_loaded(auth_server, tmp_path, monkeypatch):
    """The unit's LoadCredential=queue:... appears as $CREDENTIALS_DIRECTORY/queue."""
    cred_dir = tmp_path / "credentials"
    cred_dir.mkdir()
    (cred_dir / "queue").write_text(f"agent:{SECRET}\n")
    (cred_dir / "queue").chmod(0o400)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(cred_dir))
    q = cli.open_backend(_cfg(auth_server.url, creds=tmp_path / "absent"))
    try:
        job = q.submit(["true"], b"", name="x")
        assert q.result(job)[0] == "queued"
    finally:
        q.close()
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    anonymous = cli.open_backend(_cfg(auth_server.url, creds=tmp_path / "absent"))
    try:
        with pytest.raises(CoordinatorUnreachable) as err:
            anonymous.ping()  # the server demands them: nothing connects without
        assert SECRET not in str(err.value)
    finally:
        anonymous.close()


def test_root_reads_the_configured_file_and_refuses_one_others_can_read(auth_server, tmp_path):
    creds = tmp_path / "queue-credentials"
    creds.write_text(f"agent:{SECRET}\n")
    creds.chmod(0o600)
    q = cli.open_backend(_cfg(auth_server.url, creds=creds))
    try:
        q.ping()
    finally:
        q.close()
    creds.chmod(0o644)
    with pytest.raises(UserError) as err:
        cli.open_backend(_cfg(auth_server.url, creds=creds))
    assert "readable by other users" in err.value.message and SECRET not in err.value.message


def test_a_job_uid_cannot_read_the_credentials_file(tmp_path):
    """A real second uid (nobody, as a job's stranger uid) gets EACCES on the 0600 file."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to a second uid")
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="i28-creds-", dir="/tmp"))  # pytest's tmp dirs are 0700
    try:
        os.chmod(base, 0o755)  # as /etc: anyone may traverse, so only the file's mode protects it
        creds = base / "queue-credentials"
        creds.write_text(f"agent:{SECRET}\n")
        creds.chmod(0o600)
        conf = base / "eran-grid.toml"
        conf.write_text('[queue]\nbackend = "nats"\nurl = "nats://127.0.0.1:4222"\n')
        conf.chmod(0o644)
        probe = (
            "import os, sys\nos.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
            "for f in sys.argv[1:]:\n"
            "    try:\n        print(open(f).read())\n    except PermissionError:\n        print('EACCES')\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", probe, str(conf), str(creds)], capture_output=True, text=True, timeout=60
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert "nats://127.0.0.1:4222" in out.stdout  # the config is readable, and holds no secret
    assert out.stdout.strip().endswith("EACCES") and SECRET not in out.stdout, out.stderr


def test_errors_never_print_credentials_and_a_refusal_is_named_refused():
    from erangrid.nats_queue import NatsQueue

    q = NatsQueue(f"nats://agent:{SECRET}@127.0.0.1:{_closed_port()}", "CRED", connect_timeout=0.5)
    try:
        with pytest.raises(CoordinatorUnreachable) as err:
            q.ping()
    finally:
        q.close()
    text = str(err.value)
    assert SECRET not in text and "agent:" not in text
    assert "refused" in text and "TimeoutError" not in text
    assert "nats://***@127.0.0.1" in text


def test_a_wrong_password_is_reported_without_the_password(auth_server):
    from erangrid.nats_queue import NatsQueue

    wrong = "wrong-" + uuid.uuid4().hex[:8]
    host = auth_server.url.removeprefix("nats://")
    q = NatsQueue(f"nats://agent:{wrong}@{host}", "CRED", connect_timeout=1.0)
    try:
        with pytest.raises(CoordinatorUnreachable) as err:
            q.ping()
    finally:
        q.close()
    assert wrong not in str(err.value) and SECRET not in str(err.value)


def test_the_credentials_file_format(tmp_path):
    from erangrid import credentials

    f = tmp_path / "c"
    for text, want in (
        ("u:p:w\n", ("u", "p:w", "")),
        ("tok3n\n", ("", "", "tok3n")),
    ):
        f.write_text(text)
        f.chmod(0o600)
        c = credentials.load(f, env={})
        assert c is not None and (c.user, c.password, c.token) == want
    f.write_text("")
    assert credentials.load(f, env={}) is None  # the shipped, empty file: no credentials
    assert credentials.load(tmp_path / "absent", env={}) is None
    assert credentials.redact("nats://a:b@h:1, nats://t@h2:2 x") == "nats://***@h:1, nats://***@h2:2 x"
