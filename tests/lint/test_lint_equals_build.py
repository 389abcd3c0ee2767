"""`alma lint` reports every kas problem `alma build` would stop on, at the same file:line
(both read kas files through alma.imagebuild.kasfile). Each case was "lint clean, build
fails" (or a traceback, or a build into the wrong directory) before they shared it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

M = "jetson-orin-nano-devkit"
BOMB = "".join(f"    {chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))


@pytest.fixture(autouse=True)
def _image(checkout: Path) -> None:
    # build needs the image recipe; lint's clean layer has none
    images = checkout / "layers" / "meta-alma" / "recipes-core" / "images"
    images.mkdir(parents=True, exist_ok=True)
    (images / "alma-image.bb").write_text('SUMMARY = "ALMA-OS image"\nLICENSE = "MIT"\ninherit core-image\n')


def _feature(root: Path, name: str, text: str) -> None:
    (root / "kas" / "features" / f"{name}.yml").write_text(text)


def missing_include(root: Path) -> list[str]:
    (root / "kas" / "machines" / f"{M}.yml").write_text(
        f"header:\n  version: 14\n  includes:\n    - kas/alma.yml\n    - kas/common.yml\nmachine: {M}\n"
    )
    return [f"kas/machines/{M}.yml:5: include 'kas/common.yml' not found"]


def include_cycle(root: Path) -> list[str]:
    _feature(root, "release", "header:\n  version: 14\n  includes:\n    - kas/features/release.yml\n")
    return ["kas/features/release.yml:4: include cycle: kas/features/release.yml -> kas/features/release.yml"]


def duplicate_key(root: Path) -> list[str]:
    _feature(
        root,
        "release",
        "header:\n  version: 14\nlocal_conf_header:\n  release: |\n    A = '1'\n  release: |\n    A = '2'\n",
    )
    return ["kas/features/release.yml:6: duplicate key 'release' (first at line 4)"]


def machine_mismatch(root: Path) -> list[str]:
    (root / "kas" / "machines" / f"{M}.yml").write_text(
        "header:\n  version: 14\n  includes:\n    - kas/alma.yml\nmachine: jetson-agx-orin-devkit\n"
    )
    return [f"kas/machines/{M}.yml:5: machine file {M}.yml sets machine: 'jetson-agx-orin-devkit'"]


def alias_bomb(root: Path) -> list[str]:
    _feature(
        root,
        "release",
        "header:\n  version: 14\nlocal_conf_header:\n  release: |\n    X = '1'\n"
        "_bomb:\n    a: &a [x, x, x, x, x, x, x, x, x]\n" + BOMB,
    )
    return ["kas/features/release.yml:", "expands to more than 100000 nodes through aliases"]


CASES: dict[str, Callable[[Path], list[str]]] = {
    "missing include": missing_include,
    "include cycle": include_cycle,
    "duplicate key": duplicate_key,
    "machine/file mismatch": machine_mismatch,
    "alias bomb": alias_bomb,
}


@pytest.mark.parametrize("case", CASES)
def test_lint_reports_what_build_refuses_at_the_same_line(checkout: Path, alma_cli, case: str) -> None:
    needles = CASES[case](checkout)
    t0 = time.perf_counter()
    code, out, err = alma_cli("build", "--dry-run", "--feature", "release")
    assert code == 2, out + err
    for n in needles:
        assert n in err, err
    assert "Traceback" not in out + err and "RecursionError" not in err
    code, out, err = alma_cli("lint")
    assert code == 1, out + err
    for n in needles:
        assert n in out, out
    assert time.perf_counter() - t0 < 120  # an alias bomb would never finish


def test_a_non_utf8_kas_file_is_exit_2_naming_it_and_the_rest_is_still_linted(checkout: Path, alma_cli) -> None:
    (checkout / "kas" / "features" / "release.yml").write_bytes(b"header:\n  version: 14\n# caf\xe9\n")
    base = checkout / "kas" / "alma.yml"
    base.write_text(base.read_text() + "bogus: 1\n")
    code, out, err = alma_cli("lint")
    assert code == 2, out + err
    assert "kas/features/release.yml:3: kas file is not UTF-8 text (byte 0xe9" in out and "[unreadable]" in out
    assert "kas/alma.yml:" in out and "'bogus' was unexpected" in out  # the other files are still judged
    code, out, err = alma_cli("build", "--dry-run", "--feature", "release")
    assert code == 2 and "kas/features/release.yml:3: kas file is not UTF-8" in err


def test_a_feature_that_moves_the_machine_is_found(checkout: Path, alma_cli) -> None:
    _feature(checkout, "release", "header:\n  version: 14\nmachine: jetson-agx-orin-devkit\n")
    code, out, err = alma_cli("lint")
    assert code == 1
    assert "kas/features/release.yml:3: sets machine: 'jetson-agx-orin-devkit', overriding" in out
    code, out, err = alma_cli("build", "--dry-run", "--feature", "release")
    assert code == 2 and "kas/features/release.yml:3: sets machine" in err


def test_a_machine_file_without_machine_inherits_the_bases(checkout: Path, alma_cli) -> None:
    (checkout / "kas" / "alma.yml").write_text((checkout / "kas" / "alma.yml").read_text() + f"machine: {M}\n")
    (checkout / "kas" / "machines" / "jetson-agx-orin-devkit.yml").write_text(
        "header:\n  version: 14\n  includes:\n    - kas/alma.yml\n"
    )
    code, out, err = alma_cli("build", "--dry-run", "--machine", "jetson-agx-orin-devkit")
    assert code == 2
    assert "jetson-agx-orin-devkit.yml:1: machine file jetson-agx-orin-devkit.yml sets no machine: and inherits" in err
