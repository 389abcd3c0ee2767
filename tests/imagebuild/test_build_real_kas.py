"""alma build driving the REAL kas 5.5: local git repositories stand in for the upstream ones,
and the only fake is bitbake itself (inside the "bitbake" repository, where
oe-init-build-env puts it on PATH, as in the real layout)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import require_tool
from support_build import FAKES, read_record

from alma.imagebuild import preflight as pf

OE_INIT = """\
# Minimal stand-in for oe-core's oe-init-build-env: same contract for kas (BUILDDIR, PATH
# with ../bitbake/bin, the passthrough list, conf/ created, cwd = the build directory).
OEROOT=$(pwd)
BUILDDIR=$(realpath -m "${1:-build}")
mkdir -p "$BUILDDIR/conf"
export BUILDDIR
export PATH="$OEROOT/../bitbake/bin:$OEROOT/scripts:$PATH"
export BB_ENV_PASSTHROUGH_ADDITIONS="BUILDDIR"
cd "$BUILDDIR"
"""


def git(*args: str, cwd: Path) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")  # fmt: skip
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def make_repo(path: Path, files: dict[str, str], executable: tuple[str, ...] = ()) -> str:
    for rel, text in files.items():
        f = path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
        if rel in executable:
            f.chmod(0o755)
    git("init", "-q", "-b", "main", cwd=path)
    git("add", "-A", cwd=path)
    git("commit", "-q", "-m", "init", cwd=path)
    return git("rev-parse", "HEAD", cwd=path)


@pytest.fixture
def real_kas_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probes) -> Path:  # type: ignore[no-untyped-def]
    require_tool("git")
    kas = Path(sys.executable).parent / "kas"
    if not kas.exists():
        pytest.fail("kas is not installed in the venv: it is a dependency of alma")
    up = tmp_path / "upstream"
    bb_sha = make_repo(
        up / "bitbake",
        {"bin/bitbake": f"#!{sys.executable}\n" + (FAKES / "bitbake").read_text()},
        executable=("bin/bitbake",),
    )
    oe_sha = make_repo(
        up / "openembedded-core",
        {"oe-init-build-env": OE_INIT, "meta/conf/layer.conf": 'BBFILE_COLLECTIONS += "core"\n'},
    )
    root = tmp_path / "alma"
    (root / "kas" / "machines").mkdir(parents=True)
    (root / "kas" / "alma.yml").write_text(
        "header:\n  version: 14\nbuild_system: openembedded\ndistro: alma\ntarget: alma-image\n"
        # kas passes only listed variables to bitbake; these two steer the fake (defaults here,
        # the caller's environment wins: kas's own `env:` mechanism)
        'env:\n  FAKE_BITBAKE_SCENARIO: "success"\n  FAKE_RECORD: ""\n'
        "repos:\n  alma:\n    layers:\n      layers/meta-alma:\n"
        f"  bitbake:\n    url: file://{up / 'bitbake'}\n    branch: main\n    layers:\n      .: disabled\n"
        f"  openembedded-core:\n    url: file://{up / 'openembedded-core'}\n    commit: {oe_sha}\n"
        "    layers:\n      meta:\n"
    )
    (root / "kas" / "alma.lock.yml").write_text(
        f"header:\n  version: 14\noverrides:\n  repos:\n    bitbake:\n      commit: {bb_sha}\n"
    )
    (root / "kas" / "machines" / "jetson-orin-nano-devkit.yml").write_text(
        "header:\n  version: 14\n  includes:\n    - kas/alma.yml\nmachine: jetson-orin-nano-devkit\n"
    )
    img = root / "layers" / "meta-alma" / "recipes-core" / "images" / "alma-image.bb"
    img.parent.mkdir(parents=True)
    img.write_text('LICENSE = "MIT"\ninherit core-image\n')
    (root / "layers" / "meta-alma" / "conf").mkdir()
    (root / "layers" / "meta-alma" / "conf" / "layer.conf").write_text('BBFILE_COLLECTIONS += "alma"\n')
    (root / ".gitignore").write_text("/build/\n")
    make_repo(root, {})
    monkeypatch.setenv("ALMA_ROOT", str(root))
    monkeypatch.setenv("SHELL", "/bin/sh")
    monkeypatch.setenv("FAKE_RECORD", str(tmp_path / "record.jsonl"))
    # the real kas from the venv, no fake kas anywhere on PATH
    monkeypatch.setenv("PATH", f"{kas.parent}{os.pathsep}/usr/sbin:/usr/bin:/sbin:/bin")
    probes(ls_remote=pf._ls_remote)  # real git ls-remote: file:// URLs answer offline
    return root


@pytest.mark.slow
def test_real_kas_checks_out_pins_and_hands_bitbake_our_command_and_env(real_kas_project, tmp_path, alma):
    root = real_kas_project
    code, out, err = alma("build", "--sstate-mirror", "/srv/sstate", "--jobs", "2")
    assert code == 0, out + err
    [bb] = [c for c in read_record(tmp_path / "record.jsonl") if c["tool"] == "bitbake"]
    conf = root / "build" / "jetson-orin-nano-devkit" / "alma-build.conf"
    assert bb["argv"] == ["-R", str(conf), "alma-image"]
    assert bb["cwd"] == str(root / "build" / "jetson-orin-nano-devkit")
    # kas forwarded our environment into bitbake's and listed it for bitbake's passthrough
    assert bb["env"]["SSTATE_DIR"] == str(root / "build" / "sstate-cache")
    assert bb["env"]["DL_DIR"] == str(root / "build" / "downloads")
    assert "SSTATE_DIR" in bb["env"]["BB_ENV_PASSTHROUGH_ADDITIONS"].split()
    # kas checked out the locked commit and wrote the machine into local.conf
    head = git("rev-parse", "HEAD", cwd=root / "build" / "bitbake")
    assert head == git("rev-parse", "HEAD", cwd=tmp_path / "upstream" / "bitbake")
    local_conf = (root / "build" / "jetson-orin-nano-devkit" / "conf" / "local.conf").read_text()
    assert 'MACHINE ??= "jetson-orin-nano-devkit"' in local_conf
    assert "build succeeded" in out and "tasks: 60 attempted" in out


@pytest.mark.slow
def test_real_kas_passes_bitbakes_failure_code_through(real_kas_project, alma, monkeypatch):
    monkeypatch.setenv("FAKE_BITBAKE_SCENARIO", "fail")
    code, out, err = alma("build")
    assert code == 1
    assert "FAILED busybox_1.36.1:do_compile" in out
    shutil.rmtree(real_kas_project / "build", ignore_errors=True)
