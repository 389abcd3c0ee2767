"""`alma build --check` with the REAL kas and the REAL bitbake, openembedded-core, meta-openembedded
and meta-tegra at the pinned commits, fetched from local mirrors: a CI host with cached
repositories and no internet. Nothing here is faked.

Runs when ALMA_TEST_UPSTREAM_MIRRORS names a directory of bare mirrors (bitbake.git,
openembedded-core.git, meta-openembedded.git, meta-tegra.git); CI has no copy of upstream,
so it skips there with that reason. bitbake refuses root: run it as a build user, on a
checkout that user owns (docs/build.md, "Checking offline against mirrors").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO

from alma.artefacts.rootfs import COMPONENTS
from alma.imagebuild.project import Project

MIRRORS_ENV = "ALMA_TEST_UPSTREAM_MIRRORS"
# read at import: the suite's isolation fixture clears every ALMA_* variable before each test
MIRRORS_DIR = os.environ.get(MIRRORS_ENV)
BUILD_DIR = os.environ.get("ALMA_TEST_BUILD_DIR")  # optional: keep the tree (and parse cache) between runs
CHECK_TIMEOUT_S = 3 * 3600  # a cold parse of ~2000 recipes on a loaded 2-core host


def _mirrors() -> Path:
    value = MIRRORS_DIR
    if not value:
        pytest.skip(f"{MIRRORS_ENV} is not set: no local mirrors of the upstream repositories (CI has none)")
    path = Path(value)
    if not path.is_dir():
        pytest.fail(f"{MIRRORS_ENV}={value} is not a directory")
    if os.geteuid() == 0:
        pytest.skip("bitbake refuses to run as root: run this test as a build user")
    return path


def _gitconfig(tmp: Path, mirrors: Path) -> Path:
    """insteadOf rules sending every upstream URL of kas/alma.yml to its local mirror."""
    from alma.imagebuild.project import load_kas

    project = Project(REPO)
    kas = load_kas(project, project.kas_files("jetson-orin-nano-devkit"))
    lines = []
    for repo in kas.repos(tmp):
        if not repo.url:
            continue
        mirror = mirrors / (repo.url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git") + ".git")
        if not mirror.is_dir():
            pytest.fail(f"no mirror of {repo.url} at {mirror}")
        lines += [f'[url "file://{mirror}"]', f"\tinsteadOf = {repo.url}", "[safe]", f"\tdirectory = {mirror}"]
    lines += ['[protocol "file"]', "\tallow = always", "[advice]", "\tdetachedHead = false"]
    cfg = tmp / "mirrors.gitconfig"
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


@pytest.mark.slow
def test_check_offline_against_local_mirrors_reports_the_image_graph(tmp_path: Path) -> None:
    mirrors = _mirrors()
    if not (REPO / ".git").exists():
        pytest.skip("kas needs the checkout to be a git repository (repo-relative includes)")
    cfg = _gitconfig(tmp_path, mirrors)
    build_dir = Path(BUILD_DIR or tmp_path / "build")
    env = {
        "HOME": os.environ["HOME"],
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "LANG": "en_US.UTF-8",
        "LC_ALL": "en_US.UTF-8",
        "SHELL": "/bin/bash",
        "ALMA_ROOT": str(REPO),
        "GITCONFIG_FILE": str(cfg),  # kas copies it into the HOME it gives git
        "GIT_CONFIG_GLOBAL": str(cfg),  # for alma's own preflight git ls-remote
        # no network at all: a dead proxy, as on a CI host without internet
        "http_proxy": "http://127.0.0.1:9",
        "https_proxy": "http://127.0.0.1:9",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "alma", "build", "--check", "--json", "--build-dir", str(build_dir)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT_S,
    )
    print(proc.stderr[-4000:])  # the plain progress lines and the summary, for the record
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    graph = summary["graph"]
    print(json.dumps(graph, indent=2))
    assert summary["status"] == "succeeded" and summary["recipes_parsed"] > 1000
    assert graph["recipes"] > 100 and graph["tasks"] > graph["recipes"]
    assert graph["components"] == {c: True for c in COMPONENTS}
    assert graph["kernel"]["recipe"] == "linux-jammy-nvidia-tegra"
    assert graph["kernel"]["version"].startswith("5.15.")
    conf = (build_dir / "jetson-orin-nano-devkit" / "alma-build.conf").read_text()
    assert 'BB_NO_NETWORK = "1"' in conf
