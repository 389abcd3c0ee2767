"""The test deploy dirs' .env.initrd-flash values come from the pinned layers, not memory:
re-derive BOOTDEV / ROOTFS_DEVICE / EXTERNAL_ROOTFS_DRIVE from meta-tegra's conf files at the
commit kas/alma.lock.yml pins, with bitbake's own rules for ``?=`` (first one read wins)
and ``??=`` (weak default), and compare with tests/artefacts/alma_deployfix.MACHINES."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from artefacts.alma_deployfix import MACHINES
from support import REPO

MIRROR = Path(os.environ.get("ALMA_META_TEGRA_MIRROR", "/work/.mirror/OE4T+meta-tegra/repo"))
_ASSIGN = re.compile(r'^(?P<var>[A-Z_]+)\s*(?P<op>\?\?=|\?=|=)\s*"(?P<val>[^"]*)"')
_REQUIRE = re.compile(r"^(?:require|include)\s+(?P<path>\S+)")


def _pinned() -> str:
    lock = yaml.safe_load((REPO / "kas" / "alma.lock.yml").read_text())
    return str(lock["overrides"]["repos"]["meta-tegra"]["commit"])


def _show(commit: str, path: str) -> str | None:
    r = subprocess.run(["git", "-C", str(MIRROR), "show", f"{commit}:{path}"], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def _evaluate(commit: str, path: str, hard: dict[str, str], weak: dict[str, str]) -> None:
    text = _show(commit, path)
    if text is None:  # include (not require) of a file the layer does not have
        return
    for line in text.splitlines():
        m = _REQUIRE.match(line)
        if m:
            _evaluate(commit, m["path"], hard, weak)
            continue
        a = _ASSIGN.match(line)
        if not a:
            continue
        if a["op"] == "=":
            hard[a["var"]] = a["val"]
        elif a["op"] == "?=":
            hard.setdefault(a["var"], a["val"])
        else:
            weak.setdefault(a["var"], a["val"])


def _var(name: str, hard: dict[str, str], weak: dict[str, str]) -> str:
    val = hard.get(name, weak.get(name, ""))
    return re.sub(r"\$\{(\w+)\}", lambda m: _var(m[1], hard, weak), val)


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_env_fixture_values_are_what_the_pinned_layers_give(machine: str) -> None:
    if not (MIRROR / "HEAD").exists() and not (MIRROR / ".git").exists():
        pytest.skip(f"no meta-tegra mirror at {MIRROR} (set ALMA_META_TEGRA_MIRROR)")
    commit = _pinned()
    top = f"conf/machine/{machine}.conf"
    # a mirror this user cannot read (git's "dubious ownership" for another user's copy, no
    # read permission, a snapshot without the pinned commit) gives nothing to compare: skip
    # with git's reason rather than assert on empty values
    r = subprocess.run(["git", "-C", str(MIRROR), "cat-file", "-e", f"{commit}:{top}"], capture_output=True, text=True)
    if r.returncode != 0:
        why = r.stderr.strip().splitlines()[0] if r.stderr.strip() else f"exit {r.returncode}"
        who = f"uid {os.getuid()}"
        pytest.skip(f"meta-tegra mirror at {MIRROR} has no readable {top} at {commit[:12]} for {who}: {why}")
    hard: dict[str, str] = {}
    weak: dict[str, str] = {}
    _evaluate(commit, top, hard, weak)
    bootdev = _var("TNSPEC_BOOTDEV", hard, weak)
    default = _var("TNSPEC_BOOTDEV_DEFAULT", hard, weak)
    rootfs = re.sub(r"p[0-9]+$", "", bootdev)  # image_types_tegra.bbclass tegra_rootfs_device()
    want_bootdev, want_rootfs, want_boardid = MACHINES[machine]
    assert (bootdev, rootfs, _var("TEGRA_BOARDID", hard, weak)) == (want_bootdev, want_rootfs, want_boardid)
    external = bootdev != default  # TEGRAFLASH_ROOTFS_EXTERNAL
    assert external == ("nvme" in machine)


def test_a_mirror_this_user_cannot_use_skips_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    empty = tmp_path / "mirror"
    subprocess.run(["git", "init", "-q", "--bare", str(empty)], check=True)
    monkeypatch.setattr(sys.modules[__name__], "MIRROR", empty)
    with pytest.raises(pytest.skip.Exception, match=r"has no readable conf/machine/jetson-agx-orin-devkit.conf"):
        test_env_fixture_values_are_what_the_pinned_layers_give("jetson-agx-orin-devkit")
