"""Hostile YAML on every path the loader reads kas files by: the base file, a machine file, a
feature, an included file, a lock file and a --kas-file overlay, through `alma lint` and `alma build --dry-run`.
An alias bomb whose shared node is reached first from another branch crashed the
loader's node count (KeyError, exit 70). Each case must be a clear exit (lint 1 or 2, build 2)
naming the file, never a traceback; the loader itself is exercised with generated trees."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from alma import loader
from alma.errors import ConfigError

M = "jetson-orin-nano-devkit"
HEADER = "header:\n  version: 14\n"
# the shape that crashed: *a is reached through c's nested list before b's flat one
CROSS = "_x:\n  a: &a [1]\n  b: [*a]\n  c: [[*a]]\n"
LEVELS = "".join(f"  {chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))
BOMB_CROSS = "_bomb:\n  a: &a [x, x, x, x, x, x, x, x, x]\n" + LEVELS + "  z: [[*i], *i]\n"
HOSTILE = {
    "alias bomb (shared node reached first from a nested branch)": (BOMB_CROSS, "expands to more than 100000 nodes"),
    "recursive alias": ("_x: &r [*r]\n", "refers to itself through an alias"),
    "python tag": ("_x: !!python/object/apply:os.system [true]\n", "YAML value refused"),
    "unknown tag": ("_x: !custom 1\n", "YAML value refused"),
    "deep nesting": ("_x: " + "[" * 500 + "]" * 500 + "\n", "nested more than 100 levels"),
    "bad timestamp": ("_x: !!timestamp 2026-13-45\n", "YAML value refused"),
    "duplicate key": ("_x: 1\n_x: 2\n", "duplicate key '_x'"),
    # written with surrogateescape: \udce9 is the byte 0xe9 (latin-1 e-acute)
    "not UTF-8": ("_x: caf\udce9\n", "not UTF-8 text (byte 0xe9"),
    "huge scalar": ("_x: " + "a" * (20 << 20) + "\n", "over the 4 MiB a kas file may have"),
}


def _write_path(root: Path, where: str, body: str) -> tuple[list[str], str]:
    """Put ``body`` in the file ``where`` names; returns (build args, the file's relative path)."""
    kas = root / "kas"

    def write(path: Path, text: str) -> None:
        path.write_bytes(text.encode("utf-8", "surrogateescape"))

    if where == "feature":
        write(kas / "features" / "release.yml", HEADER + body)
        return ["--feature", "release"], "kas/features/release.yml"
    if where == "kas-file":  # an overlay named on the command line (kas's colon semantics)
        (kas / "local").mkdir(exist_ok=True)
        write(kas / "local" / "mine.yml", HEADER + body)
        return ["--kas-file", "kas/local/mine.yml"], "kas/local/mine.yml"
    if where == "machine":
        write(
            kas / "machines" / f"{M}.yml",
            "header:\n  version: 14\n  includes:\n    - kas/alma.yml\n" + f"machine: {M}\n" + body,
        )
        return [], f"kas/machines/{M}.yml"
    if where == "base":
        write(kas / "alma.yml", (kas / "alma.yml").read_text() + body)
        return [], "kas/alma.yml"
    if where == "include":
        write(kas / "common.yml", HEADER + body)
        (kas / "features" / "release.yml").write_text("header:\n  version: 14\n  includes:\n    - kas/common.yml\n")
        return ["--feature", "release"], "kas/common.yml"
    if where == "lock":
        write(kas / "alma.lock.yml", HEADER + body)
        return [], "kas/alma.lock.yml"
    raise AssertionError(where)


@pytest.fixture(autouse=True)
def _image(checkout: Path) -> None:
    images = checkout / "layers" / "meta-alma" / "recipes-core" / "images"
    images.mkdir(parents=True, exist_ok=True)
    (images / "alma-image.bb").write_text('SUMMARY = "ALMA-OS image"\nLICENSE = "MIT"\ninherit core-image\n')


@pytest.mark.parametrize("where", ["feature", "machine", "base", "include", "lock", "kas-file"])
@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_yaml_is_a_clear_error_on_every_kas_path(checkout: Path, alma_cli, where: str, case: str) -> None:
    body, needle = HOSTILE[case]
    args, rel = _write_path(checkout, where, body)
    code, out, err = alma_cli("build", "--dry-run", *args)
    assert code == 2, (code, out, err)
    assert rel in err and needle in err, err
    assert "internal error" not in err and "Traceback" not in err
    code, out, err = alma_cli("lint")
    assert code in (1, 2), (code, out, err)
    assert rel in out and needle in out, out
    assert "internal error" not in err and "Traceback" not in out + err


def test_the_crossing_alias_shape_is_sized_right_not_a_keyerror() -> None:
    node = loader.compose_yaml(CROSS, "x.yml")
    assert loader.construct_yaml(node) == {"_x": {"a": [1], "b": [[1]], "c": [[[1]]]}}


# Generated trees: anchors on random earlier nodes, referenced from random later places.
@st.composite
def alias_documents(draw: st.DrawFn) -> str:
    n = draw(st.integers(1, 12))
    lines = []
    for i in range(n):
        refs = [f"*a{j}" for j in draw(st.lists(st.integers(0, i - 1), max_size=6))] if i else []
        nest = draw(st.integers(0, 3))
        items = ", ".join(refs + ["x"]) if refs else "x"
        lines.append(f"k{i}: &a{i} " + "[" * nest + f"[{items}]" + "]" * nest)
    return "\n".join(lines) + "\n"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(alias_documents())
def test_any_alias_graph_is_either_loaded_or_refused_as_too_big(text: str) -> None:
    try:
        node = loader.compose_yaml(text, "gen.yml", max_nodes=2_000)
    except ConfigError as exc:
        assert "expands to more than 2000 nodes" in str(exc) or "nested more than" in str(exc), str(exc)
        return
    data = loader.construct_yaml(node)
    assert isinstance(data, dict) and len(data) == text.count("\n")
