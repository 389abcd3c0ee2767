"""The flashing station's packages are an extra (`pip install -e '.[flash]'`): without them
`alma boards` and `alma flash` stop with exit 2 and the install command, never an ImportError
traceback (pyudev/pyserial were required for build-only use)."""

from __future__ import annotations

import importlib.util

import pytest
from support import run_cli


@pytest.mark.parametrize("hidden", ["pyudev", "serial"])
@pytest.mark.parametrize("argv", [["boards"], ["flash", "--all", "--yes"]])
def test_without_the_flash_extra_the_station_verbs_say_how_to_install_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, hidden: str, argv: list[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == hidden else real(name, *a))
    code, out, err = run_cli(capsys, *argv)
    assert code == 2, (out, err)
    assert "the flashing station's packages are not installed" in err
    assert "try: .venv/bin/pip install -e '.[flash]'" in err and "Traceback" not in err


def test_the_build_engineers_install_does_not_pull_the_station_packages() -> None:
    import tomllib
    from pathlib import Path

    meta = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    base = " ".join(meta["dependencies"])
    assert "pyudev" not in base and "pyserial" not in base
    assert {"pyudev", "pyserial"} <= {d.split(">")[0] for d in meta["optional-dependencies"]["flash"]}
    test = {d.split(">")[0].split("<")[0] for d in meta["optional-dependencies"]["test"]}
    assert {"pyudev", "pyserial"} <= test  # the test extra stays complete
    for dep in meta["dependencies"]:
        if dep.startswith(("kas", "oelint-adv")):
            assert "<" in dep, f"{dep}: needs an upper bound (the tested version)"
