"""Fixtures for tests/update: a signing certificate, simulated boards (tests/support_update.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support_update import Lab, make_cert, require_swupdate


@pytest.fixture(scope="session")
def signer(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    return make_cert(tmp_path_factory.mktemp("signer"))


@pytest.fixture
def lab_factory(tmp_path: Path, signer: tuple[bytes, bytes]) -> Iterator[Callable[..., Lab]]:
    require_swupdate()
    labs: list[Lab] = []

    def make(names: list[str], **kw: object) -> Lab:
        lab = Lab(tmp_path / f"lab{len(labs)}", signer[0], names, **kw)
        labs.append(lab)
        return lab

    yield make
    for lab in labs:
        lab.close()
