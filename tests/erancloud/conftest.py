"""Fixtures for ERANCLOUD: a real nats-server with JetStream on loopback, the program's
processes (all ended with the test) and the test's own JetStream client."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hypothesis  # noqa: F401 - import before any test starts a thread (see tests/idlegrid/conftest.py)
import pytest
from support_erancloud import Peek, Procs


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[Any]:
    from support import require_tool
    from support_nats import NatsServer

    server = NatsServer(require_tool("nats-server"), tmp_path / "js")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.stop_all()


@pytest.fixture
def peek(nats_server: Any) -> Iterator[Callable[[], Peek]]:
    made: list[Peek] = []

    def make() -> Peek:
        p = Peek(nats_server.url)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


@pytest.fixture
def auth_server(tmp_path: Path) -> Iterator[Any]:
    """A nats-server run with the config ``init-auth`` writes; workers w1 and mallory issued."""
    from erancloud.auth import AuthDir
    from support import require_tool
    from support_nats import NatsServer

    auth = AuthDir(tmp_path / "auth")
    server = NatsServer(require_tool("nats-server"), tmp_path / "js", config=auth.conf)
    auth.init(f"127.0.0.1:{server.port}", tmp_path / "js")
    for name in ("w1", "mallory"):
        auth.issue(name, reload=False)
    server.start()
    yield server, auth
    server.stop()
